"""What every test of this repository shares, those under tests/ and each environment's own (environments/*/tests,
whose conftest.py files see nothing of tests/conftest.py's fixtures): a test leaves the process it runs in as it
found it. Tests share their pytest-xdist worker's process, and what one leaves (an entrypoint's `main` run in-process
sets up logging and environment variables) changed what later tests on that worker saw, by which files that worker
happened to run before (two fresh clones' failures, 2026-11-28 and 2026-12-08, named in each fixture)."""

import logging
import os

import pytest


@pytest.fixture(autouse=True)
def _logging_kept():
    """A test leaves logging as it found it: an entrypoint's main run in-process (`logs.setup`) makes the root
    logger's one handler a console on stdout, and the trainer's launcher disables logging; in a later test on the
    same worker every `composer_prime` INFO line then reached stdout (test_volunteer_commands read the volunteer
    pool's start-up lines as a command's output after test_bad_input's in-process `rl`, and test_logs found the console
    that feature-deletion's tests' in-process `composer-prime env` left: fresh clones, 2026-12-08).
    pytest's own handlers are left to pytest, which adds and removes them around each phase."""
    root, ours = logging.getLogger(), logging.getLogger("composer_prime")
    handlers, levels, disabled = root.handlers[:], (root.level, ours.level), logging.root.manager.disable
    captured = logging._warnings_showwarning is not None
    yield
    pytests = [h for h in root.handlers if type(h).__module__.startswith("_pytest.")]
    root.handlers[:] = [h for h in handlers if not type(h).__module__.startswith("_pytest.")] + pytests
    root.setLevel(levels[0])
    ours.setLevel(levels[1])
    logging.disable(disabled)
    if not captured:
        logging.captureWarnings(False)


@pytest.fixture(autouse=True)
def _import_time_environment_kept():
    """A test leaves the variables a process reads at import as it found them (in-process entrypoints set some,
    e.g. `rl`'s main its processes' OMP_NUM_THREADS): a worker's fork server serves only commands whose
    environment agrees with the tests' own there, and after one such leak its worker exec'd every later command
    (test_forkserver failed in two fresh clones' suites, 2026-11-28)."""
    from tests.support.forkserver import IMPORT_TIME

    before = {k: os.environ.get(k) for k in IMPORT_TIME}
    yield
    for k, v in before.items():
        if os.environ.get(k) != v:
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
