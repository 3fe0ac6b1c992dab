"""The trainer's launcher (nproc > 1) when a rank is killed by a signal: its one line on stderr,
through the logging set-up, torchrun's own reports kept off, and the exit code a shell gives a
killed process. torchrun is replaced by a stand-in that fails as it would, so no rank starts."""

import os
import subprocess
import sys

from composer_prime.utils.logs import PROCESS_ENV
from tests.conftest import ROOT

STANDIN = """
import logging, sys
import torch.distributed.run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

def torchrun(argv):
    logging.getLogger("torch.distributed.elastic").error("torchrun's failure table")
    failure = ProcessFailure(local_rank=1, pid=1234, exitcode=-9, error_file="/nonexistent")
    raise ChildFailedError("composer_prime.entrypoints.trainer", {1: failure})

torch.distributed.run.main = torchrun
from composer_prime.entrypoints.trainer import main
main(sys.argv[1:])
"""


def test_a_rank_killed_by_a_signal_is_one_logged_line_and_exit_137():
    env = {k: v for k, v in os.environ.items() if k != PROCESS_ENV}
    for name, prefix in ((None, "[trainer]"), ("trainer-2", "[trainer-2]")):  # the name `rl` gives it wins, as in every log line
        r = subprocess.run([sys.executable, "-c", STANDIN, "--nproc", "2", "--model", "tiny"], cwd=ROOT,
                           env=env | ({PROCESS_ENV: name} if name else {}), capture_output=True, text=True, timeout=300)
        assert r.returncode == 128 + 9, r.stderr
        assert r.stderr.splitlines() == [f"{prefix} rank 1 died of SIGKILL"] and r.stdout == ""
