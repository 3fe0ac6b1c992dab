"""The one logging set-up (utils/logs.py): every line of a process carries its name, `rl`'s name
for it wins, a quiet rank says only warnings, and Python warnings are prefixed like the rest."""

import io
import logging
import warnings

import pytest

from composer_prime.utils.logs import PROCESS_ENV, setup


@pytest.fixture
def restore_logging():
    root, ours = logging.getLogger(), logging.getLogger("composer_prime")
    saved = (root.handlers[:], root.level, ours.level)
    disabled = logging.root.manager.disable  # the trainer's launcher disables logging in its process (tests may run it here)
    logging.disable(logging.NOTSET)
    yield
    logging.disable(disabled)
    root.handlers[:], _, _ = saved
    root.setLevel(saved[1])
    ours.setLevel(saved[2])
    logging.captureWarnings(False)


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_prefix_levels_and_library_noise(restore_logging, monkeypatch):
    monkeypatch.delenv(PROCESS_ENV, raising=False)
    out = io.StringIO()
    setup("trainer", stream=out)
    logging.getLogger("composer_prime.trainer.train").info("step 3")
    logging.getLogger("httpx").info("HTTP Request: GET /health")  # a library's chatter stays out
    logging.getLogger("httpx").warning("retrying")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old API", DeprecationWarning)
    got = lines(out)
    assert got[:2] == ["[trainer] step 3", "[trainer] retrying"]
    assert got[2].startswith("[trainer] ") and got[2].endswith("DeprecationWarning: old API")  # then its source line


def test_rl_names_the_process_and_a_quiet_rank_only_warns(restore_logging, monkeypatch):
    monkeypatch.setenv(PROCESS_ENV, "inference-1")
    out = io.StringIO()
    setup("inference", stream=out)
    logging.getLogger("composer_prime.inference.serve").info("serving")
    assert lines(out) == ["[inference-1] serving"]
    monkeypatch.delenv(PROCESS_ENV)
    quiet = io.StringIO()
    setup("trainer", quiet=True, stream=quiet)
    log = logging.getLogger("composer_prime.trainer.train")
    log.info("step 3")
    log.warning("rejected a message")
    assert lines(quiet) == ["[trainer] rejected a message"]
