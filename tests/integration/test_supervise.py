"""When one process of a run fails, `rl`'s console ends with that process's own error line, and
the processes it stops exit quietly: their shutdown output (a traceback, torchrun's
SignalException) goes to their logs, never to the console."""

import os
import signal
import subprocess
import sys
import time

import pytest

from composer_prime.utils.supervise import supervise
from tests.conftest import ROOT, free_port
from tests.support import forkserver

# its shutdown says a lot before the traceback: more than the pipe holds, so its last lines are still in the pipe
# when it exits (a fresh clone's loaded run once read the log before they reached it)
NOISY = ("import signal, sys, time\n"
         "def die(*_):\n"
         "    print('\\n'.join(f'closing {i}' for i in range(20000)), flush=True)\n"
         "    raise RuntimeError('noisy shutdown')\n"
         "signal.signal(signal.SIGTERM, die)\n"
         "print('serving', flush=True)\n"
         "time.sleep(120)\n")
FAILING = "import sys, time; time.sleep(3); print('step 1 done', flush=True); sys.exit('disk quota exceeded')"


def test_the_console_ends_with_the_failing_process_line_and_the_stopped_stay_quiet(tmp_path, capfd):
    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            supervise({"server": [sys.executable, "-c", NOISY], "worker": [sys.executable, "-c", FAILING]},
                      tmp_path / "logs", {"worker"}, dict(os.environ))
    finally:
        signal.signal(signal.SIGTERM, old)
    out, err = capfd.readouterr()
    assert e.value.code == 1
    assert err.strip().splitlines()[-1] == "worker: disk quota exceeded"
    assert "[worker] step 1 done" in out and "[server] serving" in out
    assert "Traceback" not in out + err and "noisy shutdown" not in out + err
    log = (tmp_path / "logs" / "server.log").read_text()
    assert "closing 19999" in log and "RuntimeError: noisy shutdown" in log  # it did fail loudly, into its log only,
    assert "closing" not in out + err  # and all of it there by the time rl has stopped


def test_a_killed_process_is_named_with_its_signal(tmp_path, capfd):
    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            supervise({"worker": [sys.executable, "-c", "import os, signal; print('about to die', flush=True); "
                                                         "os.kill(os.getpid(), signal.SIGKILL)"]},
                      tmp_path / "logs", {"worker"}, dict(os.environ))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert e.value.code == 1
    assert capfd.readouterr().err.strip().splitlines()[-1] == "worker: killed by SIGKILL; its last line: about to die"


def wait_for(path, text: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if text in path.read_text():
            return
        time.sleep(0.3)
    raise AssertionError(f"no {text!r} in {timeout_s}s: {path.read_text()[-3000:]}")


def test_a_stopped_trainer_exits_quietly(tmp_path, tiny_model_dir):
    """torchrun turns SIGTERM into a SignalException traceback; the trainer entrypoint keeps it quiet."""
    out = tmp_path / "trainer.out"
    with out.open("w") as f:
        proc = forkserver.Popen([sys.executable, "-m", "composer_prime.entrypoints.trainer",
                                 "--model", str(tiny_model_dir), "--output_dir", str(tmp_path / "run"),
                                 "--transport.address", f"tcp://127.0.0.1:{free_port()}"],
                                cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(out, "ready:", proc)
        os.killpg(proc.pid, signal.SIGTERM)  # what rl does to a process it stops
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert "Traceback" not in text and "SignalException" not in text, text[-3000:]


ENDS = ("import atexit, sys, threading, time\n"
        "from composer_prime.utils.proc import run_main\n"
        "def main():\n"
        "    atexit.register(lambda: print('atexit ran'))\n"
        "    threading.Thread(target=lambda: (time.sleep(0.5), print('thread done', end=''))).start()\n"
        "    sys.stdout.write('unflushed ')\n"
        "    {end}\n"
        "run_main(main)\n")


@pytest.mark.parametrize("end, code, err", [("return", 0, ""), ("sys.exit(3)", 3, ""), ("sys.exit('disk full')", 1, "disk full\n")])
def test_run_main_ends_with_main_s_code_after_its_threads_atexit_and_buffered_output(end, code, err):
    """utils/proc.run_main (each finishing process's entry) skips only the interpreter's teardown: the exit code,
    a SystemExit's message, a running non-daemon thread's last words, atexit handlers and unflushed output stay."""
    r = forkserver.run([sys.executable, "-c", ENDS.format(end=end)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (code, err)
    assert r.stdout == "unflushed thread doneatexit ran\n"


def test_a_process_stopped_by_a_signal_does_not_wait_on_a_thread_that_never_ends():
    """A timeout test (utils/proc.STOPPED_JOIN_S, 5 s): stopped by SIGTERM (exit 143), a process whose non-daemon
    thread blocks forever (as torchft's quorum thread on a lighthouse that is gone) still ends, its atexit handlers
    run; exited normally it would wait for the thread, as the interpreter does. The 60 s guard is 12x the bound."""
    code = ("import atexit, signal, sys, threading\n"
            "from composer_prime.utils.proc import run_main\n"
            "def main():\n"
            "    atexit.register(lambda: print('atexit ran'))\n"
            "    threading.Thread(target=threading.Event().wait, name='stuck').start()\n"
            "    signal.signal(signal.SIGTERM, lambda s, _: sys.exit(128 + s))\n"
            "    print('ready', flush=True)\n"
            "    signal.pause()\n"
            "run_main(main)\n")
    proc = forkserver.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert proc.stdout.read() == "atexit ran\n"
    finally:
        if proc.poll() is None:
            proc.kill()
