"""Hangs named where they are (issue 46), each a real hang in a real run: an environment made as a user
makes one (`composer-prime env init`'s scaffold) whose reward never returns on the calls `HANG_CALLS`
names (a `time.sleep` loop under its `async def`, as a buggy reward or a dead sandbox would), until the
file `HANG_UNTIL` exists (so the test's own process frees its threads); and an inference server
stopped by SIGSTOP.

- before step 0, every reward call hangs: the watchdog's short first-batch limit names the reward
  function's file and line while the call's own timeout runs, and at that timeout the run stops in
  one line naming the environment and the place (exit 2), nothing trained;
- some reward calls hang: each is cut at `call_timeout_s`, counted as dropped/timeout, named in the
  step's progress line, and the run goes on; then inference is stopped (SIGSTOP) and the watchdog
  names it as stopped, not the orchestrator waiting on it;
- `env validate` and `env eval` cut a hung call and say which task and function.
No bound here on how long detection takes beyond each run's own timeout."""

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from composer_prime.hub.scaffold import scaffold
from composer_prime.utils.watch import proc_state
from tests.conftest import ROOT, free_port
from tests.support import forkserver
from tests.support.rl_runs import log_tails, rl_args, rows

TIMEOUT_S = 600  # each run's, this file's only clock
HANG = '''

_calls, _lock = itertools.count(1), threading.Lock()


def hangs() -> bool:
    """HANG_CALLS: "all", or the numbers of the reward calls (from 1) that hang until HANG_UNTIL exists."""
    with _lock:
        n = next(_calls)
    return os.environ.get("HANG_CALLS") == "all" or str(n) in os.environ.get("HANG_CALLS", "").split(",")
'''


@pytest.fixture(scope="module")
def hang_env(tmp_path_factory) -> Path:
    root = scaffold("hang-env", tmp_path_factory.mktemp("envs"))
    taskset = root / "hang_env" / "taskset.py"
    src = taskset.read_text().replace("import random\n", "import itertools\nimport os\nimport random\nimport threading\nimport time\n", 1)
    src = src.replace('\n\nclass HangEnvData', HANG + '\n\nclass HangEnvData', 1)
    src = src.replace("    async def accuracy(self, trace: vf.Trace) -> float:\n", (
        "    async def accuracy(self, trace: vf.Trace) -> float:\n"
        "        if hangs():\n"
        "            while not os.path.exists(os.environ.get('HANG_UNTIL', '/nonexistent')):\n"
        "                time.sleep(0.2)  # the hang\n"), 1)
    taskset.write_text(src)
    return root


def place(root: Path) -> str:
    lines = (root / "hang_env" / "taskset.py").read_text().splitlines()
    return f"hang_env/taskset.py:{next(n for n, t in enumerate(lines, 1) if t.endswith('# the hang'))} in accuracy"


def rl(run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "composer_prime.entrypoints.rl",
            *rl_args(run, "--orchestrator.eval.num_tasks", "2", "--orchestrator.batch_size", "16",
                     "--orchestrator.group_size", "4", "--orchestrator.dynamic_sampling", "false", *extra)]


def env_of(root: Path, calls: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]), "HANG_CALLS": calls,
            "HANG_UNTIL": str(tmp_path / "release")}


# The first-batch limit must not fire while the held-out evaluation generates (its 4 rollouts, before the hung reward
# calls: about 1 s at load 24 on the 2 cores, 2026-11-28: 5x that), and the calls' own timeout must outlast the limit and
# the watchdog's line (written the second the limit passed, same run): 10 s after it, where it was 15 (25 and 10).
FIRST_BATCH_S, CALL_TIMEOUT_S = 5, 15


def test_a_reward_that_never_returns_is_named_before_step_0_and_stops_the_run_in_one_line(hang_env, tmp_path):
    run = tmp_path / "run"
    r = forkserver.run(rl(run, "--orchestrator.envs", f'[{{id="hang-env", call_timeout_s={CALL_TIMEOUT_S}}}]',
                          "--watchdog.first_batch_s", str(FIRST_BATCH_S)),
                       cwd=ROOT, env=env_of(hang_env, "all", tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:] + log_tails(run)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"orchestrator: error: every rollout of hang-env in the held-out evaluation timed out \(4 of 4\): hang-env's "
        rf"reward function did not return in {CALL_TIMEOUT_S} s \(task \d+\): stuck in {re.escape(place(hang_env))} \(a reward "
        r"that is only slow needs a larger call_timeout_s\)", last), last
    said = (run / "logs" / "watchdog.log").read_text()  # the first-batch limit, before the call's own timeout
    assert re.search(rf"\(the limit: {FIRST_BATCH_S} s, for the first steps: watchdog.first_batch_s\); orchestrator waiting \d+ s on "
                     rf"hang-env's reward function \({re.escape(place(hang_env))}\) \(its own timeout ends it in \d+ s\)",
                     said), said
    assert not rows(run / "trainer" / "metrics.jsonl")  # nothing trained


def test_hung_rewards_are_dropped_the_run_goes_on_and_a_stopped_inference_is_named(hang_env, tmp_path):
    run, out = tmp_path / "run", tmp_path / "rl.out"
    cmd = rl(run, "--orchestrator.envs", '[{id="hang-env", call_timeout_s=2}]', "--watchdog.factor", "3",
             "--watchdog.floor_s", "12")
    stopped = None
    with out.open("w") as sink:
        proc = forkserver.Popen(cmd, cwd=ROOT, env=env_of(hang_env, "6,30", tmp_path), stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while len(rows(run / "orchestrator" / "metrics.jsonl")) < 4:  # steps 0..3: both hung calls behind them
                assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:] + log_tails(run)
                time.sleep(0.5)
            [pid_file] = (run / "logs" / "watch").glob("inference-*.pid")
            stopped = int(pid_file.read_text())
            os.kill(stopped, signal.SIGSTOP)
            assert proc.wait(TIMEOUT_S) == 1, out.read_text()[-3000:] + log_tails(run)
        finally:
            if stopped is not None and proc_state(stopped) in ("T", "t"):
                os.kill(stopped, signal.SIGCONT)
            proc.kill()
            (tmp_path / "release").touch()
    said = out.read_text()
    line = said.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: no process advanced for \d+ s \(the limit: \d+ s, steady: [^)]*\); inference is stopped "
                        rf"\(state T in /proc/{stopped}/stat: SIGSTOP, Ctrl-Z or a debugger; `kill -CONT {stopped}` resumes "
                        rf"it\); every process's stacks: {re.escape(str(run))}/logs/watch/\*\.stacks; stopped \(continue "
                        r"with --resume\)", line), line
    steps = rows(run / "orchestrator" / "metrics.jsonl")
    assert sum(r["dropped/timeout"] for r in steps) == 2 and [r["step"] for r in steps] == list(range(len(steps)))
    assert any(r["dropped/timeout"] for r in steps[:2]) and len(steps) >= 4  # the run went on past them
    assert re.search(rf"\| dropped timeout 1 \(hang-env's reward function did not return in 2 s \(task \d+\): stuck in "
                     rf"{re.escape(place(hang_env))}\)", said), said[-3000:]


def test_env_validate_and_eval_name_the_task_and_function_that_hung(hang_env, tmp_path, monkeypatch, capsys):
    """In this process (the stub chat server on a thread): the hung calls' threads end at the release."""
    from aiohttp import web

    from composer_prime.entrypoints.cli import parser

    def cli(argv: list[str]) -> int:
        args = parser().parse_args(argv)
        return args.func(args)

    monkeypatch.setenv("HANG_CALLS", "all")
    monkeypatch.setenv("HANG_UNTIL", str(tmp_path / "release"))
    try:
        assert cli(["env", "validate", str(hang_env), "-n", "2", "--call-timeout", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"error: task 0 (#0): hang-env's reward function did not return in 1 s (the gold answer): stuck in "
                       f"{place(hang_env)}"), err

        async def chat(request):
            return web.json_response({"choices": [{"message": {"role": "assistant", "content": "APPLE"},
                                                   "finish_reason": "stop"}]})

        port, up = free_port(), threading.Event()

        def serve() -> None:
            async def main() -> None:
                app = web.Application()
                app.router.add_post("/v1/chat/completions", chat)
                runner = web.AppRunner(app)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port).start()
                up.set()
                await asyncio.sleep(TIMEOUT_S)

            asyncio.run(main())

        threading.Thread(target=serve, daemon=True).start()
        assert up.wait(60)
        assert cli(["env", "eval", str(hang_env), "--url", f"http://127.0.0.1:{port}", "--model", "stub", "-n", "1",
                    "--call-timeout", "1", "--out", str(tmp_path / "rows.jsonl")]) == 2
        err = capsys.readouterr().err.strip()
        assert re.fullmatch(rf"error: episode 0: hang-env's reward function did not return in 1 s \(task \S+\): "
                            rf"stuck in {re.escape(place(hang_env))}", err), err
    finally:
        (tmp_path / "release").touch()
