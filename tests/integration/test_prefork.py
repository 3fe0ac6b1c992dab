"""`rl` starts its processes as forks of itself, with what they import already imported (utils/prefork.py):
each child must be what `python -m M args` would have been (its command line, its session, its environment,
Python's own signal handlers, its exit code, death with its parent), and a parent running a second thread
must not fork at all. Each case runs in a fresh single-threaded interpreter: pytest's has threads."""

import json
import os
import subprocess
import sys
import time

from tests.conftest import ROOT

DRIVER = """
import json, os, signal, sys, threading, time
from composer_prime.utils import prefork
from tests.support import prefork_entry
prefork_entry.FROM_PARENT = 41
os.environ["PREFORK_PARENT_ONLY"] = "yes"
signal.signal(signal.SIGTERM, lambda *_: print("the parent's handler ran", flush=True))
what, threaded = sys.argv[1], sys.argv[2] == "threaded"
if threaded:
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
env = {"PATH": os.environ["PATH"], "PREFORK_GIVEN": "given", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
cmd = [sys.executable, "-m", "tests.support.prefork_entry", what]
p = prefork.start(cmd, env)
if what == "sleep":
    print(json.dumps({"child": int(p.stdout.readline())}), flush=True)
    os._exit(0)  # the parent dies without a word: the child must follow it
out = p.stdout.read()
print(json.dumps({"kind": type(p).__name__, "code": p.wait(), "out": out}))
"""


def drive(what: str, threaded: bool = False) -> dict:
    done = subprocess.run([sys.executable, "-c", DRIVER, what, "threaded" if threaded else "alone"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_forked_child_is_what_python_dash_m_would_have_started():
    got = drive("report")
    assert got["kind"] == "Forked" and got["code"] == 0
    report, _, tail = got["out"].partition("\n")
    child = json.loads(report)
    assert child["from_parent"] == 41  # a fork: the parent's modules, as they were
    assert child["cmdline"] == f"{sys.executable} -m tests.support.prefork_entry report"  # what ps and pgrep -f see
    assert child["pgid"] == child["pid"] == child["sid"]  # a session of its own: a stop reaches its whole group
    assert child["env"] == {"PREFORK_GIVEN": "given", "PREFORK_PARENT_ONLY": None}  # the given environment, only
    assert child["argv"][1:] == ["report"] and child["path0"] == str(ROOT)
    assert child["sigterm_default"]
    assert tail == "unflushed, unbuffered"  # written straight through, as python -u does, and not lost at exit


def test_exit_codes_and_signals_reach_the_parent_as_popen_gives_them():
    assert drive("exit2")["code"] == 2
    assert drive("term")["code"] == -15  # SIGTERM's default action, not the parent's handler


def test_a_parent_with_a_second_thread_starts_the_command_instead():
    got = drive("report", threaded=True)
    assert got["kind"] == "Popen" and got["code"] == 0
    assert json.loads(got["out"].partition("\n")[0])["from_parent"] is None  # a fresh interpreter


def test_a_forked_child_dies_with_its_parent():
    child = drive("sleep")["child"]
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{child}") and time.time() < deadline:
        time.sleep(0.1)
    state = open(f"/proc/{child}/stat").read().split()[2] if os.path.exists(f"/proc/{child}") else "gone"
    assert state in ("gone", "Z"), state


RL_STARTS = """
import gc, json, os, sys, types
from composer_prime.entrypoints import rl
from composer_prime.utils import prefork
seen = []
def start(cmd, env, close=()):
    seen.append({"module": cmd[2], "forkable": prefork.forkable(cmd), "frozen": gc.get_freeze_count() > 100_000})
    if len(seen) == 3:
        print(json.dumps(seen), flush=True)
        raise SystemExit(0)
    return types.SimpleNamespace(stdout=open(os.devnull))  # nothing started: what rl would have done, recorded
prefork.start = start  # supervise calls it through the module
rl.main(sys.argv[1:])
"""


def test_rl_forks_every_process_where_its_shell_sets_no_thread_count(tmp_path):
    """`uv run rl` typed in a shell without OMP_NUM_THREADS (the README's commands): the config's plug-ins import
    numpy, whose OpenBLAS starts a thread per core unless told one, and a parent with a second thread is not forked;
    rl must set the count before anything imports them, or its first process (inference) is exec'd and imports all
    of torch and transformers again. What was imported is frozen out of the collector's walks before the forks."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", RL_STARTS, "@", "configs/quickstart.toml", "--output_dir", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {s["module"].rsplit(".", 1)[1] for s in seen} == {"inference", "orchestrator", "trainer"}
    assert all(s["forkable"] and s["frozen"] for s in seen), seen
