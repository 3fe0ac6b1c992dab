"""The replay step's three knobs (orchestrator/replay.py, traces/dpo_rows.py), each pinned by count,
by hand-computed number or by exact token positions: the share cap, the weight's decay, and the
loss narrowed to the tokens where the pair's replies diverge; and the launch check that refuses
divergence masking with the dataset's whole-reply reference."""

import asyncio
from types import SimpleNamespace

import pytest

from composer_prime.config.models import OrchestratorConfig
from composer_prime.contract.batches import Sample
from composer_prime.model.tokenizer import build_tokenizer
from composer_prime.orchestrator.batch import BatchContext
from composer_prime.orchestrator.replay import ReplayConfig, ReplayStep, pair_weight_at, pairs_allowed
from composer_prime.traces.dpo_rows import pair_samples
from composer_prime.trainer.loss.dpo import DPOChannel, DPOLossConfig

PROMPT = [{"role": "system", "content": "Use calc."}, {"role": "user", "content": "What is 12 + 30?"}]
CALL = '<tool_call>{"name": "%s", "arguments": {"expr": "12 + 30"}}</tool_call>'
PAIR = {"prompt": PROMPT, "chosen": [{"role": "assistant", "content": CALL % "calc"}],
        "rejected": [{"role": "assistant", "content": CALL % "calculator"}],
        "ref_chosen_logps": -3.0, "ref_rejected_logps": -4.0}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def step_with(tok, tmp_path, **section) -> ReplayStep:
    from datasets import Dataset

    Dataset.from_list([PAIR] * 20).save_to_disk(str(tmp_path / "pairs"))
    cfg = ReplayConfig(dataset=str(tmp_path / "pairs"), **section)
    return ReplayStep(cfg, SimpleNamespace(seed=0, seq_len=1024), tok, None)


def rl_rows(n: int) -> list[Sample]:
    return [Sample([1, 2, 3], [0.0] * 3, [0.0] * 3, {"rl": [0.0, 1.0, 1.0]}) for _ in range(n)]


def run_step(step: ReplayStep, n_rl: int, at: int = 0) -> tuple[BatchContext, dict]:
    batch = BatchContext(step=at, samples=rl_rows(n_rl), rollouts=[None] * n_rl)
    metrics = asyncio.run(step(batch))
    return batch, metrics


def pair_rows(batch: BatchContext) -> list[Sample]:
    return [s for s in batch.samples if "dpo" in s.channel_data]


@pytest.mark.parametrize("share, n_rl, rows", [(1.0, 32, 16), (0.2, 32, 8), (0.2, 30, 6), (0.5, 4, 4), (0.01, 32, 0)])
def test_the_share_cap_gives_an_exact_count_of_pair_rows(tok, tmp_path, share, n_rl, rows):
    """32 rl rows at a 20% cap: 4 pairs (8 / 40 = 0.2 exactly); 30 rows: 3 (a 4th would be 8 / 38 > 0.2)."""
    batch, metrics = run_step(step_with(tok, tmp_path, pairs_per_step=8, max_share=share), n_rl)
    assert len(pair_rows(batch)) == rows and metrics["pairs"] == rows / 2
    assert len(batch.samples) == n_rl + rows and rows / (n_rl + rows) <= share
    assert pairs_allowed(ReplayConfig(pairs_per_step=8, max_share=share), n_rl) == rows // 2


def test_the_weight_decays_to_the_hand_computed_value(tok, tmp_path):
    """CHORD's 0.5 -> 0.02, over 10 steps: at step 3, cosine 0.02 + 0.48 * (1 + cos(0.3 pi)) / 2, linear 0.02 + 0.48 * 0.7."""
    cosine = ReplayConfig(weight=0.5, weight_end=0.02, decay_steps=10)
    assert pair_weight_at(cosine, 0) == 0.5
    assert pair_weight_at(cosine, 3) == pytest.approx(0.40106846055, abs=1e-10)  # (1 + 0.587785) / 2 = 0.793893
    assert pair_weight_at(cosine, 5) == pytest.approx(0.26, abs=1e-12)
    assert pair_weight_at(cosine, 10) == pair_weight_at(cosine, 50) == pytest.approx(0.02, abs=1e-12)
    linear = ReplayConfig(weight=0.5, weight_end=0.02, decay_steps=10, schedule="linear")
    assert pair_weight_at(linear, 3) == pytest.approx(0.356, abs=1e-12)
    assert pair_weight_at(ReplayConfig(weight=0.7), 1000) == 0.7  # no decay configured
    batch, metrics = run_step(step_with(tok, tmp_path, weight=0.5, weight_end=0.02, decay_steps=10), 32, at=3)
    weights = {w for s in pair_rows(batch) for w in s.channel_weights["dpo"] if w != 0}
    assert weights == {pair_weight_at(cosine, 3)} and metrics["weight"] == pair_weight_at(cosine, 3)
    with pytest.raises(ValueError, match="go together"):
        ReplayConfig(weight_end=0.02)


def weighted(sample: Sample) -> list[int]:
    return [i for i, w in enumerate(sample.channel_weights["dpo"]) if w != 0]


def test_divergence_masking_weighs_exactly_the_tokens_from_where_the_replies_differ(tok):
    """The reply starts at token 36 on both rows; "calc" and "calculator" part at token 45 (the
    rows' ids agree on 0..44). k = 3: tokens 45, 46, 47 of each row and no other; k = 0: the whole reply."""
    chosen, rejected = pair_samples(tok, PAIR, "p", 1.0, 0, divergence_tokens=3)
    assert chosen.input_ids[:45] == rejected.input_ids[:45] and chosen.input_ids[45] != rejected.input_ids[45]
    assert weighted(chosen) == weighted(rejected) == [45, 46, 47]
    assert tok.decode(chosen.input_ids[45:48]) == '", "arguments' and tok.decode(rejected.input_ids[45:48]) == "ulato"
    whole_w, whole_l = pair_samples(tok, PAIR, "p", 1.0, 0)
    assert weighted(whole_w) == list(range(36, 64)) and weighted(whole_l) == list(range(36, 68))
    one_w, _ = pair_samples(tok, PAIR, "p", 1.0, 0, divergence_tokens=1)
    assert weighted(one_w) == [45]
    long_w, long_l = pair_samples(tok, PAIR, "p", 1.0, 0, divergence_tokens=100)  # to the row's end, never beyond
    assert weighted(long_w) == list(range(45, 64)) and weighted(long_l) == list(range(45, 68))


def test_masked_pairs_with_the_datasets_whole_reply_reference_are_refused_at_launch():
    orch = OrchestratorConfig.model_validate({"replay": {"dataset": "pairs", "divergence_tokens": 2}})
    with pytest.raises(ValueError, match="covers the whole reply"):
        DPOChannel.check_run(DPOLossConfig(), orch)
    for ref in ("initial", "recent"):
        DPOChannel.check_run(DPOLossConfig(reference=ref), orch)
    DPOChannel.check_run(DPOLossConfig(), OrchestratorConfig.model_validate({"replay": {"dataset": "pairs"}}))
