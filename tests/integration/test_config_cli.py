import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from composer_prime.config import (
    InferenceConfig,
    OrchestratorConfig,
    TrainerConfig,
)
from composer_prime.config.loader import parse_argv, validate
from tests.conftest import ROOT


def run_rl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "composer_prime.entrypoints.rl", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)



@pytest.mark.parametrize("args, expected", [
    (["--trainer.optim.lrr", "1"], "trainer.optim.lrr: unknown key (command line)"),
    (["--orchestrator.batch_size", "many"], "orchestrator.batch_size: Input should be a valid integer"),
    (["--max_steps", "5", "--trainer.max_steps", "6"], "trainer.max_steps: conflicts with top-level max_steps = 5"),
    (["@", "does-not-exist.toml"], "config file not found: does-not-exist.toml"),
    (["--weight_broadcast.type", "shardcast", "--weight_broadcast.keep_last", "1"],
     "weight_broadcast.keep_last: 1 is below orchestrator.max_async_level + 1 = 2"),
    (["--orchestrator.distill.enabled", "true", "--orchestrator.distill.teacher", "inference",
      "--trainer.loss.distill.estimator", "sampled"], 'trainer.loss.distill.estimator: "sampled" needs'),
    (["--orchestrator.distill.enabled", "true", "--orchestrator.distill.teacher", "inference",
      "--trainer.loss.distill.teacher", "ema"], 'trainer.loss.distill.teacher: "ema" weights live in the trainer'),
    (["--trainer.loss.distill.ema_rate", "0"], "trainer.loss.distill.ema_rate: Input should be greater than 0"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, expected):
    r = run_rl(*args, "--dry-run")
    assert r.returncode == 2
    assert expected in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1



def test_error_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[orchestrator]\ngroup_size = 'eight'\n")
    r = run_rl("@", str(bad), "--dry-run")
    assert r.returncode == 2 and f"({bad})" in r.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("max_steps = = 3\n")
    r = run_rl("@", str(broken), "--dry-run")
    assert r.returncode == 2 and "invalid TOML" in r.stderr



def test_dry_run_writes_configs_each_process_loads_alone(tmp_path):
    out = tmp_path / "run"
    r = run_rl("@", "configs/quickstart.toml", "--output_dir", str(out), "--dry-run")
    assert r.returncode == 0, r.stderr
    for name, cls in (("inference", InferenceConfig), ("orchestrator", OrchestratorConfig), ("trainer", TrainerConfig)):
        tree, prov, _ = parse_argv(["@", str(out / "configs" / f"{name}.toml")])
        cfg = validate(cls, tree, prov)
        assert Path(cfg.output_dir) == out
        assert tomllib.loads((out / "configs" / f"{name}.toml").read_text())["model"] == "tiny"



def test_shardcast_inference_without_the_trainer_key_is_refused(tmp_path):
    bad = tmp_path / "inference.toml"
    bad.write_text('[weight_broadcast]\ntype = "shardcast"\nservers = ["http://127.0.0.1:8200"]\n')
    r = subprocess.run([sys.executable, "-m", "composer_prime.entrypoints.inference", "@", str(bad), "--dry-run"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "shardcast needs `servers` and the trainer's `public_key`" in r.stderr



def test_shardcast_overlay_plans_relays_replicas_and_one_key(tmp_path):
    out = tmp_path / "run"
    r = run_rl("@", "configs/quickstart.toml", "@", "configs/shardcast.toml", "--output_dir", str(out), "--dry-run")
    assert r.returncode == 0, r.stderr
    cfgs = {p.stem: tomllib.loads(p.read_text()) for p in (out / "configs").glob("*.toml")}
    assert sorted(cfgs) == ["inference-0", "inference-1", "orchestrator", "relay-0", "trainer"]
    assert [cfgs[f"inference-{i}"]["port"] for i in (0, 1)] == [8000, 8001]
    assert cfgs["orchestrator"]["inference_urls"] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert cfgs["relay-0"]["upstream"] == ["http://127.0.0.1:8100"] and cfgs["relay-0"]["port"] == 8101
    key = cfgs["inference-0"]["weight_broadcast"]["public_key"]
    assert key == cfgs["inference-1"]["weight_broadcast"]["public_key"] == cfgs["relay-0"]["public_key"]
    assert key == str(out / "keys" / "trainer.ed25519.pub")  # named by the plan, made at launch
    assert cfgs["trainer"]["weight_broadcast"]["key_path"] == str(out / "keys" / "trainer.ed25519")
    assert not (out / "keys").exists()  # --dry-run creates no key
    assert cfgs["trainer"]["weight_broadcast"]["type"] == "shardcast"
