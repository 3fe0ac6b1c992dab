"""TOPLOC proofs (verify/toploc.py) on synthetic last hidden states: sizes pinned, honest states
match exactly, other states do not, a silent build failure (toploc's null proofs) is an error,
and the thresholds (VolunteersConfig.chunk_passes) cut where the config says."""

import base64

import pytest
import torch

from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.verify import toploc


def states(n: int, h: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, h, generator=torch.Generator().manual_seed(seed))


def test_one_proof_per_32_tokens_of_2_plus_2_topk_bytes():
    proofs = toploc.build(states(70))
    assert len(proofs) == 3  # 32 + 32 + 6
    assert [len(base64.b64decode(p)) for p in proofs] == [258, 258, 258]  # 2 + 2 x 128
    assert [len(base64.b64decode(p)) for p in toploc.build(states(33, h=48))] == [98, 98]  # top-k capped at H: 2 + 2 x 48


def test_honest_states_match_exactly_and_others_do_not():
    s = states(64)
    proofs = toploc.build(s)
    assert toploc.measure(s, proofs) == [toploc.ChunkCheck(0, 0.0, 0.0)] * 2
    other = toploc.measure(states(64, seed=1), proofs)
    assert all(c.exp_mismatches > 100 for c in other)  # of 128 committed values
    small = toploc.measure(s + 1e-2 * states(64, seed=2), proofs)  # 1% noise: mantissas move, few exponents
    assert all(c.exp_mismatches < 20 and c.mant_err_mean > 0 for c in small)


def test_a_silent_build_failure_is_an_error(monkeypatch):
    import toploc.poly as tp

    class Failing:  # any failure inside toploc's builder: it logs it and returns null proofs
        null = staticmethod(tp.ProofPoly.null)

        @staticmethod
        def from_points_tensor(*args):
            raise RuntimeError("boom")

    monkeypatch.setattr(tp, "ProofPoly", Failing)
    with pytest.raises(toploc.ProofError, match="null proofs"):
        toploc.build(states(40))


def test_thresholds_cut_where_the_config_says():
    cfg = VolunteersConfig(thresholds={"float32": {"max_exp_mismatches": 8, "max_mant_mean": 2.0, "max_mant_median": 1.0}})
    assert cfg.for_dtype("float32").logprob_tol == 2e-4  # the calibrated values the config did not replace
    assert cfg.for_dtype("bfloat16").logprob_tol == 1.0 and cfg.for_dtype(None) is cfg.for_dtype("float32")
    # an audit in a dtype without thresholds is judged by those of the dtype the run audits in
    assert VolunteersConfig(dtype="bfloat16").for_dtype("float16") == VolunteersConfig().for_dtype("bfloat16")
    cfg = cfg.for_dtype("float32")
    assert cfg.chunk_passes({"exp_mismatches": 8, "mant_err_mean": 2.0, "mant_err_median": 1.0})
    for bad in ({"exp_mismatches": 9}, {"mant_err_mean": 2.01}, {"mant_err_median": 1.5}):
        assert not cfg.chunk_passes({"exp_mismatches": 0, "mant_err_mean": 0.0, "mant_err_median": 0.0, **bad}), bad
