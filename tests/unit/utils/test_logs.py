"""The one logging set-up (utils/logs.py): every line of a process carries its name, `rl`'s name
for it wins, a quiet rank says only warnings, and Python warnings are prefixed like the rest."""

import io
import logging
import warnings

from composer_prime.utils.logs import PROCESS_ENV, setup


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_prefix_levels_and_library_noise(monkeypatch):
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


def test_rl_names_the_process_and_a_quiet_rank_only_warns(monkeypatch):
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


def test_an_in_process_main_sets_up_a_console(monkeypatch):
    """What an entrypoint's main run in-process does (test_bad_input runs `rl`'s): the root's one handler a console
    on stdout, composer_prime at INFO; the next test must not inherit it (the root conftest.py's `_logging_kept`)."""
    monkeypatch.setenv(PROCESS_ENV, "rl")
    setup("rl")
    assert [type(h).__name__ for h in logging.getLogger().handlers] == ["_Console"]
    assert logging.getLogger("composer_prime").getEffectiveLevel() == logging.INFO


def test_the_next_test_sees_no_console_left(capsys):
    """Run after the test above (a file's tests run in order, on one worker): no console of it left on the root, so
    a library's INFO line reaches no stdout (without `_logging_kept` it printed `[rl] ...`)."""
    assert "_Console" not in [type(h).__name__ for h in logging.getLogger().handlers]
    logging.getLogger("composer_prime.volunteer.pool").info("volunteer pool on http://127.0.0.1:1")
    assert capsys.readouterr().out == ""
