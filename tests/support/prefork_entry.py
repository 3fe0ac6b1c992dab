"""A process entry for test_prefork.py, started the way `rl` starts its own: it says what it finds itself to be."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from composer_prime.utils.proc import run_main

FROM_PARENT = None  # set by the parent before it forks; a fresh interpreter would see None
PRELOAD = ("tests.support.prefork_heavy",)


def main(argv: list[str] | None = None) -> None:
    what = (sys.argv[1:] if argv is None else argv)[0]
    if what == "exit2":
        raise SystemExit(2)
    if what == "term":  # the parent's SIGTERM handler must not be this process's
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    if what == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(60)
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                      "cmdline": open("/proc/self/cmdline").read().rstrip("\0"), "argv": sys.argv,
                      "env": {k: os.environ.get(k) for k in ("PREFORK_GIVEN", "PREFORK_PARENT_ONLY")},
                      "path0": sys.path[0], "from_parent": FROM_PARENT, "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}))
    print("unflushed, unbuffered", end="")


if __name__ == "__main__":
    run_main(main)
