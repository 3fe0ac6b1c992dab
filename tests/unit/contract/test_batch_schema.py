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
