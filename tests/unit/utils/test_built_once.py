"""utils/fs.built_once: a cached directory built by one caller however many ask at once."""

import threading
import time
from pathlib import Path

import pytest

from composer_prime.utils.fs import built_once


def test_concurrent_callers_build_once_and_all_get_the_built_directory(tmp_path):
    calls: list[Path] = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        time.sleep(0.3)  # long enough that the other callers arrive while this one builds
        tmp.mkdir()
        (tmp / "weights").write_text("w")
        (tmp / "READY").write_text("ok")

    out = tmp_path / "models" / "m"
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(built_once(out, build))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got == [out] * 3 and (out / "weights").read_text() == "w"
    assert sorted(p.name for p in out.parent.iterdir()) == ["m", "m.lock"]  # no temporary left behind


def test_a_build_without_its_marker_is_refused_and_leaves_nothing(tmp_path):
    out = tmp_path / "m"
    with pytest.raises(RuntimeError, match="no READY"):
        built_once(out, lambda tmp: tmp.mkdir())
    assert list(tmp_path.iterdir()) == [tmp_path / "m.lock"]  # neither the directory nor its temporary
    assert built_once(out, lambda tmp: (tmp.mkdir(), (tmp / "READY").write_text("ok"))) == out  # the next caller builds
