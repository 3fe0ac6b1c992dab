"""The batch schema on its own: a wrong schema version, garbage and a misaligned sample are refused."""


import msgpack
import pytest

from composer_prime.contract.batches import Sample, SchemaError, decode, encode
from tests.support.batches import make_batch


def test_wrong_schema_version_and_garbage_are_rejected():
    payload = msgpack.unpackb(encode(make_batch()))
    payload["schema"] = 999
    with pytest.raises(SchemaError, match="schema 999"):
        decode(msgpack.packb(payload))
    with pytest.raises(SchemaError):
        decode(b"\x00not msgpack at all")
    with pytest.raises(SchemaError, match="not a training batch"):
        decode(msgpack.packb({"type": "hello"}))


def test_misaligned_sample_is_rejected():
    with pytest.raises(SchemaError, match="advantages has 2 entries for 3 tokens"):
        Sample(input_ids=[1, 2, 3], sampling_logprobs=[0, 0, 0], advantages=[0, 0], channel_weights={})


def test_encode_is_byte_for_byte_msgpack_of_asdict():
    """encode builds the sample dicts itself (asdict's deep copy of every per-token list was nearly all
    of its time); the bytes must stay those of packing asdict(batch), channel data's dataclasses included."""
    from dataclasses import asdict

    from composer_prime.contract.batches import SCHEMA_VERSION, Batch
    from composer_prime.contract.distill import Teacher
    from composer_prime.contract.dpo import PairRow

    samples = [*make_batch().samples,
               Sample([1, 2, 3], [0.0, -0.5, -1.25], [0.0, 0.5, 0.5], {"dpo": [0.0, 1.0, 1.0]}, temperature=0.7,
                      policy_version=4, channel_data={"dpo": PairRow(pair="p0", chosen=True, ref_logp=-3.5)}),
               Sample([5, 6, 7], [0.0] * 3, [0.0] * 3, {"distill": [0, 1, 1]},
                      channel_data={"distill": [Teacher([5, 40, 6, 7], 2, 1, 2)], "note": ({"k": (1, 2)},)})]
    batch = Batch(step=7, samples=samples)
    assert encode(batch) == msgpack.packb({"schema": SCHEMA_VERSION, "type": "batch", **asdict(batch)}, use_bin_type=True)
    assert decode(encode(batch)).samples[-1].channel_data["distill"][0]["input_ids"] == [5, 40, 6, 7]
