"""`rl`'s configuration at the command line: bad input one line and exit 2 (the real command once, as a
subprocess; the other rows through the same `resolve` in-process, where a traceback would be an
exception rather than exit 2), errors naming their file, `--dry-run`'s configs and the SHARDCAST plan."""

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
from composer_prime.entrypoints.rl import resolve
from tests.conftest import ROOT
from tests.support import forkserver


def run_rl(*args: str) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def resolve_rl(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """`rl ARGS` up to where it would start processes, in this process: (exit code, stderr)."""
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    try:
        resolve(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_bad_input_to_the_real_command_is_one_line_and_exit_code_2():
    r = run_rl("--trainer.optim.lrr", "1", "--dry-run")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr == "config error: trainer.optim.lrr: unknown key (command line)\n"


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
def test_bad_input_is_one_line_and_exit_code_2(args, expected, capsys, monkeypatch):
    code, err = resolve_rl(capsys, monkeypatch, *args, "--dry-run")
    assert code == 2 and err.startswith("config error: ") and expected in err
    assert len(err.strip().splitlines()) == 1


def test_error_names_the_file(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text("[orchestrator]\ngroup_size = 'eight'\n")
    code, err = resolve_rl(capsys, monkeypatch, "@", str(bad), "--dry-run")
    assert code == 2 and f"({bad})" in err
    broken = tmp_path / "broken.toml"
    broken.write_text("max_steps = = 3\n")
    code, err = resolve_rl(capsys, monkeypatch, "@", str(broken), "--dry-run")
    assert code == 2 and "invalid TOML" in err


def test_dry_run_writes_configs_each_process_loads_alone(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code, err = resolve_rl(capsys, monkeypatch, "@", "configs/quickstart.toml", "--output_dir", str(out), "--dry-run")
    assert code == 0, err
    for name, cls in (("inference", InferenceConfig), ("orchestrator", OrchestratorConfig), ("trainer", TrainerConfig)):
        tree, prov, _ = parse_argv(["@", str(out / "configs" / f"{name}.toml")])
        cfg = validate(cls, tree, prov)
        assert Path(cfg.output_dir) == out
        assert tomllib.loads((out / "configs" / f"{name}.toml").read_text())["model"] == "tiny"



def test_shardcast_inference_without_the_trainer_key_is_refused(tmp_path):
    bad = tmp_path / "inference.toml"
    bad.write_text('[weight_broadcast]\ntype = "shardcast"\nservers = ["http://127.0.0.1:8200"]\n')
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.inference", "@", str(bad), "--dry-run"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "shardcast needs `servers` and the trainer's `public_key`" in r.stderr


def test_shardcast_overlay_plans_relays_replicas_and_one_key(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code, err = resolve_rl(capsys, monkeypatch, "@", "configs/quickstart.toml", "@", "configs/shardcast.toml",
                           "--output_dir", str(out), "--dry-run")
    assert code == 0, err
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
