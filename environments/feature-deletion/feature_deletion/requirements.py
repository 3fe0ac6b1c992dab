"""What a project declares it needs to run its tests: runtime and test requirements, read from
its metadata without ever building or installing it.

Read, all of them, from the unpacked source (before stripping: `*.egg-info` is stripped later):
PKG-INFO (Requires-Dist, test extras), `*.egg-info/requires.txt`, pyproject.toml (`[project]`,
PEP 735 dependency groups, poetry), setup.cfg, literal `setup(...)` arguments in setup.py,
requirement files named for tests or development, and tox.ini's `[testenv] deps`. Metadata keeps
its version specifiers; requirement files and tox deps give names only (their pins are often old
enough not to install on today's Python). Tooling that tests never import (linters, docs, release
tools) is left out, and so is the project itself.
"""

from __future__ import annotations

import ast
import configparser
import email.parser
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

TEST_EXTRAS = ("test", "tests", "testing")
DEV_EXTRAS = ("dev", "develop", "development")  # read only when no test extra exists
TOOLING = {"tox", "nox", "pre-commit", "black", "flake8", "isort", "mypy", "ruff", "pylint", "twine", "coveralls",
           "codecov", "bumpversion", "bump2version", "bump-my-version", "check-manifest", "wheel", "build",
           "setuptools-scm", "pyroma", "readme-renderer", "towncrier", "docutils", "pydocstyle", "pycodestyle",
           "pyflakes", "autopep8", "yapf", "bandit", "safety", "ipython", "ipdb", "pdbpp", "sphinx"}
TOOLING_PREFIXES = ("sphinx", "flake8-", "types-", "mypy-", "pre-commit")
REQ_FILE = re.compile(r"(^|[-_/])(test|tests|testing|dev|develop|ci)([-_.]|$)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Declared:
    names: set[str] = field(default_factory=set)       # the project's own names (normalised)
    runtime: list[str] = field(default_factory=list)   # requirement strings
    test: list[str] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)   # where they were read

    def add(self, reqs: list[str], test: bool, origin: str, names_only: bool = False) -> None:
        kept = []
        for text in reqs:
            req = _parse(text)
            if req is None or normalize(req.name) in self.names or _tooling(req.name):
                continue
            kept.append(req.name if names_only else str(req))
        if kept:
            (self.test if test else self.runtime).extend(kept)
            self.origins.append(origin)

    def requirements(self, with_test: bool = True) -> list[str]:
        seen, out = set(), []
        for r in self.runtime + (self.test if with_test else []):
            if r not in seen:
                seen.add(r)
                out.append(r)
        return out


def _tooling(name: str) -> bool:
    n = normalize(name)
    return n in TOOLING or n.startswith(TOOLING_PREFIXES)


def _parse(text: str) -> Requirement | None:
    """A requirement that applies to this interpreter (its extra markers already chosen)."""
    text = text.split(" #", 1)[0].strip()
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.url:
        return None
    if req.marker is not None:  # the extra was chosen by the caller: the marker decides on the platform only
        named = re.findall(r"""extra\s*==\s*['"]([^'"]+)['"]""", str(req.marker)) or [""]
        if not any(req.marker.evaluate({"extra": e}) for e in named):
            return None
        req.marker = None
    return req


def _pick_extras(extras: dict[str, list[str]], names: set[str]) -> list[str]:
    """The requirements of the test extras (else the dev ones), and of the project's own extras
    they name (`test = ["mypkg[toml]", ...]`), never the project itself."""
    todo = [e for e in extras if e in TEST_EXTRAS] or [e for e in extras if e in DEV_EXTRAS]
    seen, out = set(), []
    while todo:
        extra = todo.pop(0)
        if extra in seen or extra not in extras:
            continue
        seen.add(extra)
        for text in extras[extra]:
            req = _parse(text)
            if req is not None and normalize(req.name) in names:
                todo += [normalize(x) for x in req.extras]
            else:
                out.append(text)
    return out


def _pkg_info(root: Path, d: Declared) -> None:
    for info in [root / "PKG-INFO"]:
        if not info.is_file():
            continue
        msg = email.parser.Parser().parsestr(info.read_text(errors="replace"))
        if msg.get("Name"):
            d.names.add(normalize(msg["Name"]))
        runtime, extras = [], {}
        for text in msg.get_all("Requires-Dist") or []:
            m = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", text)
            (extras.setdefault(normalize(m.group(1)), []) if m else runtime).append(text)
        d.add(runtime, False, "PKG-INFO")
        d.add(_pick_extras(extras, d.names), True, "PKG-INFO extras")


def _egg_info(root: Path, d: Declared) -> None:
    for req_txt in sorted([*root.glob("*.egg-info/requires.txt"), *root.glob("src/*.egg-info/requires.txt")]):
        section, runtime, extras = "", [], {}
        for line in req_txt.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
                continue
            if line:
                extra, _, marker = section.partition(":")
                text = f"{line}; {marker}" if marker else line
                (extras.setdefault(normalize(extra), []) if extra else runtime).append(text)
        d.add(runtime, False, req_txt.relative_to(root).as_posix())
        d.add(_pick_extras(extras, d.names), True, f"{req_txt.relative_to(root).as_posix()} extras")


def _pyproject(root: Path, d: Declared) -> None:
    path = root / "pyproject.toml"
    if not path.is_file():
        return
    try:
        data = tomllib.loads(path.read_text(errors="replace"))
    except tomllib.TOMLDecodeError:
        return
    project = data.get("project", {})
    if isinstance(project.get("name"), str):
        d.names.add(normalize(project["name"]))
    d.add(list(project.get("dependencies", [])), False, "pyproject.toml [project]")
    extras = {normalize(k): v for k, v in project.get("optional-dependencies", {}).items()}
    d.add(_pick_extras(extras, d.names), True, "pyproject.toml extras")
    groups = data.get("dependency-groups", {})
    d.add(_pick_extras({normalize(k): _group(groups, k) for k in groups}, d.names), True, "pyproject.toml dependency-groups")
    poetry = data.get("tool", {}).get("poetry", {})
    if isinstance(poetry.get("name"), str):
        d.names.add(normalize(poetry["name"]))
    d.add([n for n in poetry.get("dependencies", {}) if n != "python"], False, "pyproject.toml poetry", True)
    pgroups = {normalize(k): list(v.get("dependencies", {})) for k, v in poetry.get("group", {}).items()}
    pgroups.setdefault("dev", list(poetry.get("dev-dependencies", {})))
    d.add(_pick_extras(pgroups, d.names), True, "pyproject.toml poetry groups", True)


def _group(groups: dict, name: str, depth: int = 0) -> list[str]:
    out = []
    for item in groups.get(name, []):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and "include-group" in item and depth < 10:
            out += _group(groups, item["include-group"], depth + 1)
    return out


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _setup_cfg(root: Path, d: Declared) -> None:
    path = root / "setup.cfg"
    if not path.is_file():
        return
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        return
    if cfg.has_option("metadata", "name"):
        d.names.add(normalize(cfg.get("metadata", "name")))
    if cfg.has_section("options"):
        d.add(_lines(cfg.get("options", "install_requires", fallback="")), False, "setup.cfg")
        d.add(_lines(cfg.get("options", "tests_require", fallback="")), True, "setup.cfg tests_require")
    if cfg.has_section("options.extras_require"):
        extras = {normalize(k): _lines(v) for k, v in cfg.items("options.extras_require")}
        d.add(_pick_extras(extras, d.names), True, "setup.cfg extras")


def _setup_py(root: Path, d: Declared) -> None:
    path = root / "setup.py"
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            try:
                value = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if kw.arg == "name" and isinstance(value, str):
                d.names.add(normalize(value))
            elif kw.arg == "install_requires" and isinstance(value, (list, tuple)):
                d.add([str(v) for v in value], False, "setup.py")
            elif kw.arg == "tests_require" and isinstance(value, (list, tuple)):
                d.add([str(v) for v in value], True, "setup.py tests_require")
            elif kw.arg == "extras_require" and isinstance(value, dict):
                extras = {normalize(str(k)): [str(v) for v in vs] for k, vs in value.items()
                          if isinstance(vs, (list, tuple))}
                d.add(_pick_extras(extras, d.names), True, "setup.py extras")


def _req_file(path: Path, root: Path, seen: set[Path]) -> list[str]:
    if path in seen or not path.is_file() or not path.resolve().is_relative_to(root.resolve()):
        return []
    seen.add(path)
    out = []
    for line in _lines(path.read_text(errors="replace")):
        if line.startswith(("-r ", "--requirement ")):
            out += _req_file(path.parent / line.split(None, 1)[1], root, seen)
        elif not line.startswith(("-", ".")):
            out.append(line)
    return out


def _requirement_files(root: Path, d: Declared) -> None:
    """requirements.txt (runtime), and the files named for tests, else those named for development
    (a dev lock file pins a whole toolchain: docs, type checkers, release tools)."""
    seen: set[Path] = set()
    candidates = [*root.glob("*requirements*.txt"), *root.glob("requirements/*.txt"), *root.glob("tests/requirements*.txt"),
                  *root.glob("test/requirements*.txt")]
    kinds: dict[str, list[Path]] = {"runtime": [], "test": [], "dev": []}
    for path in sorted(set(candidates)):
        rel = path.relative_to(root).as_posix().lower()
        m = REQ_FILE.search(rel.removesuffix(".txt"))
        if "doc" not in rel and (m or rel == "requirements.txt"):
            kinds["runtime" if not m else "test" if m.group(2).startswith("test") else "dev"].append(path)
    for path in kinds["runtime"]:
        d.add(_req_file(path, root, seen), False, path.relative_to(root).as_posix(), names_only=True)
    for path in kinds["test"] or kinds["dev"]:
        d.add(_req_file(path, root, seen), True, path.relative_to(root).as_posix(), names_only=True)


def _tox(root: Path, d: Declared) -> None:
    path = root / "tox.ini"
    if not path.is_file():
        return
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cfg.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        return
    if cfg.has_option("testenv", "deps"):
        reqs, seen = [], set()
        for line in _lines(cfg.get("testenv", "deps")):
            if line.startswith("-r"):
                reqs += _req_file(root / line[2:].strip().split("{", 1)[0], root, seen)
            elif "{" not in line and not line.startswith("-"):
                reqs.append(line.split(":", 1)[-1].strip() if re.match(r"^[\w,-]+:\s", line) else line)
        d.add(reqs, True, "tox.ini", names_only=True)


def declared(root: Path) -> Declared:
    """Everything `root` (an unpacked sdist or a checkout) declares; names are read first so the
    project never lists itself."""
    d = Declared()
    for reader in (_pkg_info, _pyproject, _setup_cfg, _setup_py, _egg_info, _requirement_files, _tox):
        reader(root, d)
    # a name found late (setup.py) still filters what an earlier reader kept
    d.runtime = [r for r in d.runtime if normalize(Requirement(r).name) not in d.names]
    d.test = [r for r in d.test if normalize(Requirement(r).name) not in d.names]
    return d
