"""No silent hangs (issue 37): a trainer that hangs mid-run is found by `rl`'s watchdog, every
process's stacks are written, one line names where the trainer stopped, and the run stops (then
`--resume` continues it to the end) or, with `watchdog.on_stall = "wait"`, waits on.

The hangs are a test plug-in (tests/plugins/hang_once.py), a loss channel with no weights. The first
run hangs after optimizer step 4 in native code that holds the GIL (libc's `system`), where no Python
signal handler runs: SIGUSR1's stacks never come, so the watchdog's SIGUSR2 has faulthandler dump
the C-level view into `trainer-<pid>.faults`, which must name the plug-in's line (issue 42 part 3
item 3). The resumed run hangs again, in Python, and is told to wait: the watchdog names the
function from the stacks, the run goes on, and once the test lets the hang end it finishes every
step with nothing lost or redone. The quickstart's tiny model at the test's size (4 groups of 4 a
step, 4 held-out tasks: only the plumbing is under test, nothing learnt) takes about a second a step
at most here, loaded, so the watchdog's floor (12 s) is the limit that applies, on a host several
times slower too (and the first-batch limit, 12 s too, where the resumed run hangs before a step gap
is known). The line names the trainer, not the orchestrator waiting on it for weights (each process
says what it waits on)."""

import os
import re
import subprocess
import sys
import time

from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.rl_runs import log_tails, rl_args, rows

STEPS, HANG_AT, HANG_AGAIN_AT, FLOOR_S = 8, 4, 2, 12
PLUGIN = ROOT / "tests" / "plugins" / "hang_once.py"
LINES = {mark: n for n, text in enumerate(PLUGIN.read_text().splitlines(), 1)
         for mark in ("# the native hang", "# the Python hang") if text.endswith(mark)}
NATIVE, PYTHON = LINES["# the native hang"], LINES["# the Python hang"]
# the quickstart's batch of 16 groups of 8 and its 96 held-out tasks were 128 rollouts a step and 192 evaluated for
# nothing asserted; at its size a loaded host's slow step (6.5 s, 2026-11-28) set the resumed run's limit to 33 s
SMALL = ("--orchestrator.batch_size", "16", "--orchestrator.group_size", "4", "--orchestrator.eval.num_tasks", "4")
TIMEOUT_S = 600  # each run's, and the resumed run's wait for its stall: this test's only clock


def stalled(line: str, where: str, run) -> None:
    """The watchdog's line: silent past its limit (the floor, or more where steps were slow), naming `where`."""
    silent, limit = map(int, re.search(r"no process advanced for (\d+) s \(the limit: (\d+) s, ", line).groups())
    assert silent >= limit >= FLOOR_S, line
    assert line.endswith(f"; trainer stopped in {where}; every process's stacks: {run}/logs/watch/*.stacks"), line


def test_hangs_in_native_code_and_in_python_are_found_named_stopped_or_waited_on_and_resumed(tmp_path):
    run = tmp_path / "run"
    watch = run / "logs" / "watch"
    env = dict(os.environ)  # the plug-in by its module under the repository (the runs' cwd): forked, not exec'd
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl",
           *rl_args(run, "--max_steps", str(STEPS), "--trainer.ckpt.interval", "2", *SMALL),
           "--trainer.loss.plugins", '["tests.plugins.hang_once:HangOnce"]', "--watchdog.floor_s", str(FLOOR_S), "--watchdog.factor", "5",
           "--watchdog.first_batch_s", str(FLOOR_S)]

    hung = forkserver.run(cmd, cwd=ROOT, env={**env, "HANG_ONCE": str(tmp_path / "hung"), "HANG_AT": str(HANG_AT),
                                               "HANG_IN": "native"}, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert hung.returncode == 1, hung.stdout[-2000:] + hung.stderr[-2000:] + log_tails(run)
    line = hung.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and line.endswith("; stopped (continue with --resume)"), hung.stderr[-2000:]
    assert "Traceback" not in hung.stderr, hung.stderr[-2000:]
    line = line.removeprefix("error: ").removesuffix("; stopped (continue with --resume)")
    me = f"trainer-{(tmp_path / 'hung').read_text()}"
    stalled(line, f"native code (no Python stack answered: see {me}.faults)", run)
    faults = (watch / f"{me}.faults").read_text()  # faulthandler's: the hung thread's innermost frame is the C call's line
    assert re.search(rf'\(most recent call first\):\n  File "{re.escape(str(PLUGIN))}", line {NATIVE} in after_step\n',
                     faults), faults
    stacks = {p.name.rpartition("-")[0]: p.read_text() for p in watch.glob("*.stacks")}
    assert set(stacks) >= {"orchestrator", "inference"}, sorted(stacks)  # the others answered SIGUSR1
    assert "task " in stacks["orchestrator"]  # an event loop's tasks, each with the frames it awaits in
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == list(range(HANG_AT - 1))  # the 4th step (3) hung
    assert (run / "logs" / "watchdog.log").read_text().strip().endswith(line)  # the run's own record of it

    release, out = tmp_path / "release", tmp_path / "resumed.out"
    with out.open("w") as sink:
        resumed = forkserver.Popen(cmd + ["--resume", "--watchdog.on_stall", "wait"], cwd=ROOT, stdout=sink,
                                   stderr=subprocess.STDOUT, text=True,
                                   env={**env, "HANG_ONCE": str(tmp_path / "hung2"), "HANG_AT": str(HANG_AGAIN_AT),
                                        "HANG_UNTIL": str(release)})
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while len(records := (run / "logs" / "watchdog.log").read_text().splitlines()) < 2:
                assert resumed.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:] + log_tails(run)
                time.sleep(1)
            release.touch()  # a run that stopped on its stall would exit 1 now
            assert resumed.wait(TIMEOUT_S) == 0, out.read_text()[-3000:] + log_tails(run)
        finally:
            resumed.kill()
    said = out.read_text()
    stalled(records[1].partition(" ")[2].partition(" ")[2], f"hang_once.py:{PYTHON} in after_step", run)
    assert "; waiting on (watchdog.on_stall = wait)" in said and "stopped (continue with --resume)" not in said, said[-3000:]
    again = (watch / f"trainer-{(tmp_path / 'hung2').read_text()}.stacks").read_text()
    assert again.startswith(f"WHERE hang_once.py:{PYTHON} in after_step") and "thread MainThread:" in again
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == list(range(STEPS))  # nothing lost or redone
    assert (watch / f"{me}.faults").read_text() == faults  # the hung run's dump outlives the resume
