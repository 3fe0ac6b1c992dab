"""The `dpo` channel's reference (trainer/loss/dpo.py, `trainer.loss.dpo.reference`): which weights'
log-probs are log pi_ref. Each test moves the policy between steps and pins the reference to the
log-probs of one exact version of the weights, recomputed here from a saved copy, so that a
reference from the wrong version (or the pair's dataset number, or the policy itself) fails."""

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from composer_prime.config.models import LossConfig
from composer_prime.contract.batches import Batch
from composer_prime.trainer.loss import Context, Objective, token_logprobs
from tests.unit.trainer.test_dpo_loss import PAIRS, row


class LocalContext(Context):
    """The trainer's context without FSDP: a frozen copy is a deep copy of the weights it began with."""

    def __init__(self, policy):
        super().__init__(policy, "unused", 0)
        self.initial = copy.deepcopy(policy)

    def frozen_copy(self):
        return copy.deepcopy(self.initial)


def batch_at(step: int, mask: tuple[int, int] | None = None) -> Batch:
    """PAIRS as rows; `mask` = (first, count): weigh only that many response tokens from `first` on."""
    samples = []
    for i, (prompt, yw, yl, rw, rl) in enumerate(PAIRS):
        for ys, chosen, ref in ((yw, True, rw), (yl, False, rl)):
            s = row(prompt, ys, f"p{i}", chosen, ref)
            if mask:
                w = s.channel_weights["dpo"]
                keep = range(len(prompt) + mask[0], len(prompt) + mask[0] + mask[1])
                s.channel_weights["dpo"] = [x if j in keep else 0.0 for j, x in enumerate(w)]
            samples.append(s)
    return Batch(step=step, samples=samples)


def seq_logps(model, batch: Batch) -> dict[tuple[str, bool], float]:
    """Each row's log-prob summed over its weighted tokens, one plain forward per row."""
    out = {}
    with torch.no_grad():
        for s in batch.samples:
            ids = torch.tensor([s.input_ids])
            lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0]
            w = torch.tensor(s.channel_weights["dpo"][1:]) != 0
            out[(s.channel_data["dpo"]["pair"], s.channel_data["dpo"]["chosen"])] = lp[w].sum().item()
    return out


def refs_used(channel) -> dict[tuple[str, bool], float]:
    return {(pid, side == "w"): p[side][1] for pid, p in channel.pairs.items() for side in ("w", "l")}


def nudge(model, seed: int) -> None:
    """Move the policy as an optimizer step would: every weight, by a seeded amount."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def channel_for(model, reference: str, ref_every: int = 1):
    ctx = LocalContext(model)
    cfg = LossConfig.model_validate({"weights": {"rl": 0.0, "dpo": 1.0}, "dpo": {"reference": reference, "ref_every": ref_every}})
    return Objective(cfg, ctx).channels["dpo"], ctx


@pytest.fixture
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def close(a: dict, b: dict) -> bool:
    return all(math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-5) for k in a)


def test_recent_reference_is_the_policy_of_the_last_multiple_of_ref_every(model):
    """ref_every = 2: steps 0 and 1 use version 0 (the initial weights), steps 2 and 3 version 2,
    step 4 version 4; never the version being trained (except at the steps that take a snapshot)."""
    channel, ctx = channel_for(model, "recent", ref_every=2)
    versions = {}
    for step in range(5):
        if step:
            nudge(model, step)  # the policy now is version `step`
        versions[step] = copy.deepcopy(model)
        batch = batch_at(step)
        channel.begin(batch)
        want = {0: 0, 1: 0, 2: 2, 3: 2, 4: 4}[step]
        assert close(refs_used(channel), seq_logps(versions[want], batch)), f"step {step}: not version {want}'s log-probs"
        if want != step:
            assert not close(refs_used(channel), seq_logps(model, batch))  # the reference lags the policy here
        assert channel.ref_step == want
    assert list(channel.modules()) == ["DPO reference"]  # checkpointed, so a resumed run keeps its snapshot


def test_initial_reference_stays_the_starting_weights_and_is_not_the_datasets_number(model):
    channel, ctx = channel_for(model, "initial")
    start = seq_logps(model, batch_at(0))
    channel.begin(batch_at(0))
    assert close(refs_used(channel), start)
    assert all(p["loss"] == pytest.approx(math.log(2), abs=1e-6) for p in channel.pairs.values())  # policy = reference
    nudge(model, 1)
    channel.begin(batch_at(1))
    assert close(refs_used(channel), start)
    assert all(abs(p["loss"] - math.log(2)) > 1e-4 for p in channel.pairs.values())  # a moved policy: a real margin
    dataset = {(f"p{i}", c): ref for i, (_, _, _, rw, rl) in enumerate(PAIRS) for c, ref in ((True, rw), (False, rl))}
    assert not close(refs_used(channel), dataset)


def test_the_dataset_reference_is_the_pairs_own_number(model):
    channel, _ = channel_for(model, "dataset")
    channel.begin(batch_at(0))
    assert refs_used(channel) == {("p0", True): -9.5, ("p0", False): -6.0, ("p1", True): -7.0, ("p1", False): -12.5}


def test_a_trained_reference_scores_only_the_tokens_the_row_weighs(model):
    """Rows masked to 1 response token from the 2nd: the reference (and the policy) sum that one token."""
    channel, _ = channel_for(model, "initial")
    masked = batch_at(0, mask=(1, 1))
    channel.begin(masked)
    assert close(refs_used(channel), seq_logps(model, masked))
    assert not close(refs_used(channel), seq_logps(model, batch_at(0)))
