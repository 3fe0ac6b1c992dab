"""Who the watchdog names (utils/watch.py `diagnose`), on real processes that say what they wait for
(utils/watchdog.py `waiting`) and answer SIGUSR1 with their stacks: an orchestrator waiting on
inference names inference, where it is (it waits on nothing) or, stopped by SIGSTOP, that it is
stopped (state T) and how to resume it; an orchestrator waiting on an environment's reward function
names the function's place and the time its own timeout ends the wait."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from composer_prime.utils.watch import Watch, diagnose, proc_state
from composer_prime.utils.watchdog import WATCH_ENV

CHILD = """
import sys, time
from composer_prime.utils import watchdog

def idle():
    while True:
        time.sleep(0.05)

watchdog.install(sys.argv[1])
watchdog.ready()
if len(sys.argv) > 2:
    with watchdog.waiting(sys.argv[2], "a call", float(sys.argv[3]) or None, lambda: "my_env/taskset.py:41 in reward"):
        idle()
idle()
"""


def start(where: Path, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", CHILD, *args], env={**os.environ, WATCH_ENV: str(where)})
    deadline = time.monotonic() + 60
    while not (where / f"{args[0]}-{p.pid}.pid").exists():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return p


def test_the_innermost_cause_is_named_a_stopped_process_as_stopped_a_reward_by_its_place(tmp_path):
    procs = []
    try:
        peers, outside = tmp_path / "peers", tmp_path / "outside"
        procs += [start(peers, "inference"), start(peers, "orchestrator", "inference", "0")]
        inference, orchestrator = procs
        watch = Watch(peers, factor=5, floor_s=10, startup_s=600, drivers={"orchestrator"})
        pids = {"orchestrator": orchestrator.pid, "inference": inference.pid}
        v = diagnose(watch, pids, ["orchestrator"])
        assert (v.blamed, v.until) == ("inference", None) and v.cause.startswith("inference stopped in ") \
            and v.cause.endswith(" in idle"), v.cause  # the orchestrator waits on it; it waits on nothing
        os.kill(inference.pid, signal.SIGSTOP)
        while proc_state(inference.pid) != "T":
            time.sleep(0.05)
        v = diagnose(watch, pids, ["orchestrator"])
        assert (v.blamed, v.cause) == ("inference", f"inference is stopped (state T in /proc/{inference.pid}/stat: SIGSTOP, "
                                                    f"Ctrl-Z or a debugger; `kill -CONT {inference.pid}` resumes it)")
        os.kill(inference.pid, signal.SIGCONT)

        until = time.time() + 100
        procs.append(start(outside, "orchestrator", "my-env's reward function", str(until)))
        v = diagnose(Watch(outside, 5, 10, 600, drivers={"orchestrator"}), {"orchestrator": procs[-1].pid}, ["orchestrator"])
        assert v.blamed == "orchestrator" and abs(v.until - until) < 0.01, v
        assert v.cause.startswith("orchestrator waiting ") and \
            v.cause.endswith(" s on my-env's reward function (my_env/taskset.py:41 in reward)"), v.cause
    finally:
        for p in procs:
            p.kill()
            p.wait()
