"""Runs that several test files read, made once per test session (pytest fixtures, registered in
tests/integration/conftest.py), whichever pytest-xdist worker asks first: the others wait for it and
read the same run (`once`). A run that failed fails its every reader with the same message.

- `relay_run`: the volunteers' quickstart (`rl @ configs/quickstart.toml @ configs/volunteers.toml`, the
  README's command) with two trusted inference servers pulling every step through one SHARDCAST relay,
  two honest `uv run worker` processes and one dishonest worker (its weights 1% off the run's) joining at
  run time, the run waiting for all three before its first step (`volunteers.wait_for`). Read by
  test_rl_volunteers.py's two tests (the pool; the relay, once test_rl_shardcast.py): one 50-step run
  where there were two runs of 30 and 50 steps.
- `tool_calc_warm_start`: the README's hint self-distillation warm start (tool-calc demonstrations with
  wrong calls, then `sft`), run as the README types it with 60 steps in place of 800. Read by
  test_readme.py (the README's `rl` command after it) and test_rl_distill.py (both distill teachers).
- `tool_calc_distill_run`: the README's GRPO + distill command (configs/tool-calc-distill.toml, the EMA teacher in
  the trainer) on that warm start, 3 steps of 16. Read by test_readme.py (the README's claims) and test_rl_distill.py
  (the distill loss in every step with hinted turns, the trainer's teacher; the inference teacher is its own run).
- `wheelhouse`: docs/install.md's `composer-prime wheelhouse` command for a GPU node (download only, about 180 MB).
  Read by test_wheelhouse.py (what is in it) and test_bench_gpu_check.py (installed into a stand-in node).
"""

from __future__ import annotations

import fcntl
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from composer_prime.contract.volunteer import node_id
from composer_prime.utils.net import check_reachable
from composer_prime.volunteer.keys import load_or_make
from tests.conftest import ROOT, free_port
from tests.support import forkserver
from tests.support.readme_runs import bare_work_dir, run_commands, small_rl
from tests.support.rl_runs import log_tails

RELAY_STEPS = 50
RELAY_VOLUNTEERS = 3  # the run waits for them all (`volunteers.wait_for`) before its first step
T = TypeVar("T")


def once(name: str, tmp_path_factory: pytest.TempPathFactory, make: Callable[[Path], T]) -> T:
    """`make(directory)`, run by the first worker of this session to ask; every other worker waits for it (an
    exclusive lock) and gets the same result (pickled beside it). Workers' base directories are siblings
    (popen-gw0, popen-gw1, ...); without workers the parent is the session's own.

    A maker that dies without raising (pytest-timeout's thread method ends its worker with os._exit, the OOM
    killer, a crash) leaves its `.started` marker and no result: the next reader, once the dead maker's lock
    is released, fails at once saying so, where it would silently make the whole run again."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done, failed, started = root / f"{name}.pickle", root / f"{name}.failed", root / f"{name}.started"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists() and started.exists() and not failed.exists():
            failed.write_text(f"its maker ({started.read_text()}) died before it finished (killed by pytest-timeout, "
                              "or by the system): see that worker's output")
        if failed.exists():
            pytest.fail(f"the shared run {name} failed for an earlier reader:\n{failed.read_text()}")
        if not done.exists():
            started.write_text(f"pid {os.getpid()}, worker {os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
            try:
                result = make(Path(tmp_path_factory.mktemp(name)))
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {e}"[-4000:])
                raise
            done.write_bytes(pickle.dumps(result))
        return pickle.loads(done.read_bytes())


@dataclass
class RelayRun:
    run: Path  # the rl output directory
    origin_port: int
    ids: dict[str, str]  # worker name -> the first 12 characters of its node id, as the metrics name it
    cheat_rc: int
    cheat_err: str


@pytest.fixture(scope="session")
def relay_run(tmp_path_factory) -> RelayRun:
    return once("relay_run", tmp_path_factory, make_relay_run)


def reachable(address: str) -> bool:
    try:
        check_reachable(address, 1.0)
        return True
    except OSError:
        return False


def make_relay_run(tmp: Path, seed: int = 0) -> RelayRun:
    """The run, in `tmp`, at `seed` (the tests' thresholds were set from seeds 0, 1 and 2)."""
    run, pool_port, origin_port = tmp / "run", free_port(), free_port()
    rl = forkserver.Popen(
        [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "@", "configs/volunteers.toml",
         "--inference_replicas", "2", "--seed", str(seed), "--output_dir", str(run), "--max_steps", str(RELAY_STEPS),
         "--orchestrator.volunteers.wait_for", str(RELAY_VOLUNTEERS),
         "--inference.port", str(free_port()), "--weight_broadcast.port", str(origin_port),
         "--transport.address", f"tcp://127.0.0.1:{free_port()}", "--orchestrator.volunteers.port", str(pool_port),
         "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "96"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not reachable(f"127.0.0.1:{pool_port}"):  # the pool is up: the run is under way
        assert rl.poll() is None and time.time() < deadline, log_tails(run)
        time.sleep(0.5)
    keys = {name: load_or_make(tmp / f"{name}.key") for name in ("honest0", "honest1", "cheat")}
    for name in keys:  # the README's invite, one per volunteer (the cheat's revoked when it is ejected)
        forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "volunteers", "invite", name, "--run", str(run),
                        "--out", str(tmp / f"{name}.token")], cwd=ROOT, check=True, capture_output=True)

    def flags(name: str) -> list[str]:
        return ["--join", f"http://127.0.0.1:{pool_port}", "--token_file", str(tmp / f"{name}.token"),
                "--key_path", str(tmp / f"{name}.key"), "--work_dir", str(tmp / name), "--device", "cpu",
                "--concurrency", "4"]  # dtype: the run's
    workers = {name: forkserver.Popen([sys.executable, "-m", "composer_prime.entrypoints.worker", *flags(name)], cwd=ROOT,
                                      stderr=subprocess.PIPE, text=True) for name in ("honest0", "honest1")}
    workers["cheat"] = forkserver.Popen([sys.executable, "-m", "tests.support.dishonest_worker", "OtherWeights", *flags("cheat")],
                                        cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert rl.wait(timeout=1500) == 0, log_tails(run)
        cheat_rc, cheat_err = workers["cheat"].wait(timeout=60), workers["cheat"].stderr.read()
    finally:
        for p in [rl, *workers.values()]:
            p.kill()
            p.wait()
    return RelayRun(run, origin_port, {name: node_id(k)[:12] for name, k in keys.items()}, cheat_rc, cheat_err)


# The README's first two hint self-distillation commands, and what a test appends to each: 60 SFT steps (25 s of CPU
# where 120 took 40). Measured 2026-11-28 (2-core machine, loaded), DISTILL_RL's run on it at seeds 0, 1, 2: error sites
# 16 to 20 and distill tokens 242 to 385 in every step, loss/distill 0.005 to 0.011, the first evaluation's tool_calls
# 0.0625 at each seed (one call in 16 tasks: the readers assert > 0); at 40 steps the policy called no tool (0.0).
WARM_START = [("uv run python -m tool_calc.demos --out outputs/tool-calc-demos.jsonl --max-operand 99 -n 4000", list),
              ("uv run sft --model tiny --data outputs/tool-calc-demos.jsonl --output_dir outputs/tool-calc-sft "
               "--max_steps 800 --batch_size 16 --lr 1e-3 --warmup_steps 20", lambda: ["--max_steps", "60"])]


@dataclass
class WarmStart:
    work: Path  # the working directory the README's commands ran in

    @property
    def model(self) -> Path:
        return self.work / "outputs" / "tool-calc-sft"


@pytest.fixture(scope="session")
def tool_calc_warm_start(tmp_path_factory) -> WarmStart:
    return once("tool_calc_warm_start", tmp_path_factory, lambda tmp: WarmStart(run_commands(WARM_START, bare_work_dir(tmp))))


# The README's GRPO + distill command after the warm start, and what a test appends: 3 steps of 4 groups of 4, and
# the collapse guards off. The test-sized warm start (60 SFT steps, not the README's 800) gets no call right (reward 0
# in every rollout, also after 300 steps: measured 2026-11-28), so every group is flat, and with the guards on (the
# defaults: only failed samples of groups with rl signal) nothing would be distilled; off, the flat groups' error turns
# are, which is what shows the channel's loss non-zero in the real loop. The guards: test_distill_guard.py, test_batch_steps.py.
NO_GUARDS = ["--orchestrator.distill.flat_groups", "true", "--orchestrator.distill.only_failed", "false",
             "--trainer.loss.distill.guard", "none"]
DISTILL_RL = ("uv run rl @ configs/tool-calc-distill.toml",
              lambda: [*small_rl(), "--max_steps", "3", "--orchestrator.batch_size", "16", "--orchestrator.group_size", "4",
                       *NO_GUARDS])


@dataclass
class DistillRun:
    run: Path  # its output directory


@pytest.fixture(scope="session")
def tool_calc_distill_run(tmp_path_factory, tool_calc_warm_start: WarmStart) -> DistillRun:
    # in the warm start's working directory, as the README's third command follows its first two
    return once("tool_calc_distill_run", tmp_path_factory,
                lambda tmp: DistillRun(run_commands([DISTILL_RL], tool_calc_warm_start.work) / "outputs" / "tool-calc-distill"))


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """docs/install.md's `composer-prime wheelhouse` command, its --out a fresh directory (tests/support/node_env.py)."""
    from tests.support.node_env import build_wheelhouse

    return once("wheelhouse", tmp_path_factory, build_wheelhouse)
