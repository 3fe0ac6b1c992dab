"""Several environments in one run: exact batch shares, per-environment metrics, clear config errors."""

import json
import sys

import pytest

from composer_prime.config import OrchestratorConfig
from tests.conftest import ROOT, free_port
from tests.support import forkserver


def test_batch_shares_are_exact_or_the_config_is_refused():
    cfg = OrchestratorConfig.model_validate({"batch_size": 64, "envs": [{"id": "reverse-text", "ratio": 3},
                                                                         {"id": "tool-calc", "ratio": 1, "group_size": 4}]})
    assert cfg.groups_per_step() == {"reverse-text": 6, "tool-calc": 4}  # 48 rollouts in 8s, 16 in 4s
    with pytest.raises(ValueError, match=r"env 'reverse-text': batch_size 64 x ratio 0.8 = 51.2 rollouts, not a positive multiple of its group size 8"):
        OrchestratorConfig.model_validate({"batch_size": 64, "envs": [{"id": "reverse-text", "ratio": 4},
                                                                      {"id": "tool-calc", "ratio": 1}]})
    with pytest.raises(ValueError, match="each environment id may appear once"):
        OrchestratorConfig.model_validate({"envs": [{"id": "tool-calc"}, {"id": "tool-calc"}]})


def test_rl_mixes_a_single_turn_and_a_tool_environment(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/mix.toml", "--output_dir", str(run),
                    "--max_steps", "2", "--inference.port", str(free_port()), "--transport.address",
                    f"tcp://127.0.0.1:{free_port()}", "--orchestrator.dynamic_sampling", "false"],
                   cwd=ROOT, check=True, timeout=600)
    rows = [json.loads(ln) for ln in (run / "orchestrator" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollouts" in r]
    assert len(steps) == 2 and all(r["rollouts"] == 64 and r["groups"] == 10 for r in steps)  # 6 x 8 + 4 x 4
    for r in steps:
        assert 0 <= r["env/reverse-text/reward"] <= 1 and 0 <= r["env/tool-calc/reward"] <= 1
        assert {"env/tool-calc/turns", "env/tool-calc/tool_calls", "env/tool-calc/tool_errors"} <= set(r)
        assert 1 <= r["env/tool-calc/turns"] <= 3
    first = rows[0]
    assert first["eval_reward"] == pytest.approx(0.75 * first["eval/reverse-text/reward"] + 0.25 * first["eval/tool-calc/reward"])
    trainer = [json.loads(ln) for ln in (run / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trainer] == [0, 1] and all(t["trained_tokens"] > 0 for t in trainer)
