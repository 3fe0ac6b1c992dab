"""`composer-prime toploc install` (verify/install.py) chooses what to run: a wheelhouse's toploc sdist is
built from that file with no package index (a GPU node offline: its hash checked first, a changed file
refused before anything runs), `--target` goes to every pip command, and without a local sdist PyPI's is
built. pip is recorded, not run; the real builds, offline from a wheelhouse into `--target` on CPython
3.12 with torch 2.11 and online in a fresh venv, are docs/install.md's and test_toploc_install.py's."""

import hashlib
import importlib.util

import pytest

from composer_prime.verify import install as inst

FAKE = b"an sdist's bytes"


@pytest.fixture
def pip(monkeypatch):
    """Every pip command, recorded; toploc imports once a build command has run."""
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(inst, "_pip", lambda *args, still="": calls.append(args))
    monkeypatch.setattr(inst, "importable", lambda target=None: any("--no-build-isolation" in c for c in calls))
    return calls


def test_the_wheelhouses_sdist_is_built_offline_into_target(pip, tmp_path, monkeypatch):
    (tmp_path / inst.SDIST).write_bytes(FAKE)
    monkeypatch.setattr(inst, "SDIST_SHA256", hashlib.sha256(FAKE).hexdigest())
    said = inst.install(tmp_path, tmp_path / "site")
    assert pip == [("install", "--no-deps", "--no-build-isolation", "--no-index", "--find-links", str(tmp_path),
                    "--target", str(tmp_path / "site"), str(tmp_path / inst.SDIST))]
    assert said == f"toploc 0.1.6 built from {inst.SDIST} against torch in {tmp_path / 'site'}"


def test_a_changed_sdist_is_refused_before_any_pip(pip, tmp_path):
    (tmp_path / inst.SDIST).write_bytes(FAKE)  # not PyPI's file
    with pytest.raises(RuntimeError, match=r"its sha256 is not PyPI's for toploc 0\.1\.6"):
        inst.install(tmp_path)
    assert pip == []


def test_offline_without_setuptools_is_one_line(pip, tmp_path, monkeypatch):
    (tmp_path / inst.SDIST).write_bytes(FAKE)
    monkeypatch.setattr(inst, "SDIST_SHA256", hashlib.sha256(FAKE).hexdigest())
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "setuptools" else find(name, *a))
    with pytest.raises(RuntimeError, match="needs setuptools"):
        inst.install(tmp_path)
    assert pip == []


def test_without_a_local_sdist_pypis_is_built(pip, tmp_path):
    inst.install(tmp_path)
    assert pip[-1] == ("install", "--no-deps", "--no-build-isolation", "--no-binary", "toploc", "toploc==0.1.6")
    assert not any("--no-index" in c for c in pip)


def test_already_importable_runs_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(inst, "importable", lambda target=None: True)
    monkeypatch.setattr(inst, "_pip", lambda *a, **k: pytest.fail("pip ran"))
    assert inst.install(tmp_path, tmp_path / "site") == f"toploc already importable in {tmp_path / 'site'}"


def test_a_prebuilt_wheel_is_reinstalled_by_pip_where_there_is_no_uv(monkeypatch):
    """On a node without uv the prebuilt wheel goes through pip, whose flag is --force-reinstall (pip refused uv's
    --reinstall: `no such option`, and `toploc install --wheels wheelhouse` failed there; issue 46)."""
    monkeypatch.setattr(inst.shutil, "which", lambda name: None)
    assert inst.pip_command("install", "--no-deps", "--reinstall", "t.whl") == [
        inst.sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "t.whl"]
    monkeypatch.setattr(inst.shutil, "which", lambda name: "/bin/uv")
    assert inst.pip_command("install", "--no-deps", "--reinstall", "t.whl") == [
        "/bin/uv", "pip", "install", "--python", inst.sys.executable, "--no-deps", "--reinstall", "t.whl"]
