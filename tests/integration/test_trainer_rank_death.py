"""The trainer's launcher (nproc > 1) when a rank is killed by a signal: its one line on stderr,
through the logging set-up, torchrun's own reports kept off, and the exit code a shell gives a
killed process. A real run: the trainer entrypoint under real torchrun, 2 gloo ranks on CPU,
rank 1 SIGKILLed once both are built and rank 0 waits for its first batch (about 15 s)."""

import os
import signal
import subprocess
import sys
import threading

import psutil

from composer_prime.utils.logs import PROCESS_ENV
from tests.conftest import ROOT, free_port
from tests.support import forkserver


def test_a_rank_killed_by_a_signal_is_one_logged_line_and_exit_137(tiny_model_dir, tmp_path):
    config = tmp_path / "trainer.toml"  # as `rl` starts it, `trainer @ trainer.toml`; nproc as a user types it, a flag
    config.write_text(f'model = "{tiny_model_dir}"\noutput_dir = "{tmp_path / "run"}"\n'
                      f'[transport]\naddress = "tcp://127.0.0.1:{free_port()}"\n')
    env = os.environ | {PROCESS_ENV: "trainer-2", "OMP_NUM_THREADS": "1"}  # the name `rl` gives it wins, as in every log line
    launcher = forkserver.Popen([sys.executable, "-m", "composer_prime.entrypoints.trainer", "@", str(config), "--nproc", "2"],
                                cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(240, launcher.kill)  # a launcher that never gets ready ends the read below, not the suite
    guard.start()
    try:
        ready = launcher.stdout.readline()  # rank 0's; the other rank is quiet
        assert ready.startswith("[trainer-2] ready: ") and "world 2 (gloo)" in ready, ready + launcher.stderr.read()
        ranks = {r.environ()["LOCAL_RANK"]: r for r in psutil.Process(launcher.pid).children()}  # torchrun runs in the launcher
        assert sorted(ranks) == ["0", "1"]
        ranks["1"].send_signal(signal.SIGKILL)
        out, err = launcher.communicate(timeout=120)
    finally:
        guard.cancel()
        if launcher.poll() is None:
            launcher.kill()  # its ranks die with it (exit_with_parent)
    assert launcher.returncode == 128 + 9, err
    assert out == ""  # nothing more from rank 0 nor from the launcher on stdout
    # stderr holds the launcher's one line: no torchrun failure table, no elastic agent warning, no traceback,
    # no progress bars of transformers' weight loading
    assert [ln for ln in err.splitlines() if ln.strip()] == ["[trainer-2] rank 1 died of SIGKILL"], err
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks.values())  # torchrun stopped rank 0
