"""utils/prefork.py's choice, without forking (test_prefork.py in the integration tier forks for real): only our
imported entrypoints, run by this interpreter, from a one-thread parent, on a machine without an NVIDIA device
(a parent's CUDA check leaves a forked child unable to use CUDA); preloading only where something will be forked."""

import sys

from composer_prime.utils import prefork

ENTRY = [sys.executable, "-m", "tests.support.prefork_entry", "report"]


def test_only_an_imported_entry_of_this_python_from_one_thread_without_a_gpu(monkeypatch):
    import tests.support.prefork_entry  # noqa: F401 - imported: what the parent preloads

    monkeypatch.setattr(prefork, "single_threaded", lambda: True)
    monkeypatch.setattr(prefork, "has_gpu", lambda: False)
    assert prefork.forkable(ENTRY)
    assert not prefork.forkable(["/usr/bin/python3", *ENTRY[1:]])  # another interpreter
    assert not prefork.forkable([sys.executable, "-m", "json.tool"])  # not imported (and no main)
    assert not prefork.forkable([sys.executable, "-c", "pass"])
    monkeypatch.setattr(prefork, "single_threaded", lambda: False)
    assert not prefork.forkable(ENTRY)
    monkeypatch.setattr(prefork, "single_threaded", lambda: True)
    monkeypatch.setattr(prefork, "has_gpu", lambda: True)
    assert not prefork.forkable(ENTRY)


def test_preload_imports_an_entrys_preload_only_where_it_will_fork(monkeypatch):
    monkeypatch.delitem(sys.modules, "tests.support.prefork_entry", raising=False)
    monkeypatch.delitem(sys.modules, "tests.support.prefork_heavy", raising=False)
    monkeypatch.setattr(prefork, "has_gpu", lambda: True)
    prefork.preload(["tests.support.prefork_entry"])
    assert "tests.support.prefork_entry" not in sys.modules
    monkeypatch.setattr(prefork, "has_gpu", lambda: False)
    prefork.preload(["tests.support.prefork_entry"])
    assert "tests.support.prefork_heavy" in sys.modules  # the entry's PRELOAD
