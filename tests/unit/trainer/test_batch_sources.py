"""sft's batch source (trainer/sources.py, trainer/sft.py): the examples sft has always drawn for a
seed, checked by the objective's channels, as the wire types the orchestrator sends: ce weight on
the answer's tokens, a dpo pair as the channel's two rows."""

import json
import random

import pytest

from composer_prime.config.models import LossConfig
from composer_prime.contract.batches import SchemaError
from composer_prime.model.tokenizer import build_tokenizer
from composer_prime.model.warm_start import encode_example
from composer_prime.traces.dataset import render
from composer_prime.traces.dpo_rows import pair_samples
from composer_prime.trainer.loss import Objective
from composer_prime.trainer.sft import read_jsonl
from composer_prime.trainer.sources import DatasetSource

PROMPT = [{"role": "system", "content": "Reverse the letters."}, {"role": "user", "content": "a b c"}]
PAIR = {"prompt": PROMPT, "chosen": [{"role": "assistant", "content": "c b a"}],
        "rejected": [{"role": "assistant", "content": "a b c"}], "ref_chosen_logps": -3.5, "ref_rejected_logps": -2.0}


def objective(channel: str) -> Objective:
    return Objective(LossConfig.model_validate({"weights": {channel: 1.0}}))


def test_ce_examples_weigh_the_answer_and_are_drawn_as_sft_always_drew_them(tmp_path):
    tok = build_tokenizer()
    lines = [{"messages": [*PROMPT[:1], {"role": "user", "content": " ".join("abcdefgh"[:n])},
                           {"role": "assistant", "content": " ".join("abcdefgh"[:n][::-1])}]} for n in range(1, 9)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    samples = read_jsonl(tmp_path / "d.jsonl", tok)
    ids, answer = encode_example(tok, lines[2]["messages"])
    assert samples[2].input_ids == ids and samples[2].channel_weights == {"ce": [float(a) for a in answer]}
    assert sum(answer) == len(tok.encode("c b a", add_special_tokens=False)) + 1  # the answer and its end token

    def draws(seed: int, steps: int) -> list[list[int]]:
        src = DatasetSource(len(samples), lambda i, key: [samples[i]], 5, seed)
        return [[samples.index(s) for s in src.batch(step, objective("ce")).samples] for step in range(steps)]

    old_sft = random.Random(0)  # the draws sft has always made: rng.choice, example after example
    assert draws(0, 3) == [[old_sft.choice(range(8)) for _ in range(5)] for _ in range(3)]
    assert draws(1, 3) != draws(0, 3)
    src = DatasetSource(len(samples), lambda i, key: [samples[i]], 5, 0)
    with pytest.raises(ValueError, match="steps come in order"):
        src.batch(1, objective("ce"))


def test_a_pair_becomes_the_dpo_channels_two_rows_and_drawn_twice_two_pairs():
    tok = build_tokenizer()
    source = DatasetSource(1, lambda i, key: pair_samples(tok, PAIR, key), 3, 0)
    batch = source.batch(0, objective("dpo"))  # the dpo channel's own checks pass: a chosen and a rejected row per pair
    assert len(batch.samples) == 6 and len({s.channel_data["dpo"]["pair"] for s in batch.samples}) == 3
    chosen, rejected = batch.samples[:2]
    ids, start = render(tok, PROMPT, PAIR["chosen"][0])
    assert chosen.input_ids == ids and chosen.channel_weights["dpo"] == [0.0] * start + [1.0] * (len(ids) - start)
    assert (chosen.channel_data["dpo"]["chosen"], chosen.channel_data["dpo"]["ref_logp"]) == (True, -3.5)
    assert (rejected.channel_data["dpo"]["chosen"], rejected.channel_data["dpo"]["ref_logp"]) == (False, -2.0)


def test_a_batch_the_channel_refuses_is_not_handed_over():
    tok = build_tokenizer()
    bad = {**PAIR, "ref_chosen_logps": 1.5}  # a log-prob above 0
    with pytest.raises(SchemaError, match="ref_logp must be a finite log-prob"):
        DatasetSource(1, lambda i, key: pair_samples(tok, bad, key), 1, 0).batch(0, objective("dpo"))
