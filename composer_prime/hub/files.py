"""Which files of an environment go into its source archive, and the content hash over them.

These are the `prime` CLI's rules (0.18.0, `prime env push`), reimplemented so that our hash
equals the one `prime` sends; a test compares the two on awkward trees. The rules:

- top level: only `README.md`, `pyproject.toml` and `*.py` files;
- every non-hidden subdirectory, recursively, except `dist`, `build`, `outputs`, `__pycache__`
  and `*.egg-info` (at any depth);
- never hidden files, symlinks, or anything the root `.gitignore` matches;
- hash = sha256 over, for each file in sorted relative-path order, `file:<path>` then its bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {"dist", "__pycache__", "build", "outputs"}
TOP_LEVEL_PATTERNS = ("README.md", "pyproject.toml", "*.py")


@dataclass(frozen=True)
class IgnoreRule:
    regex: re.Pattern[str]
    negated: bool


def _glob_to_regex(pattern: str) -> str:
    """gitignore glob -> regex body: `*`/`?` stop at `/`, `**` crosses it, `[...]` is a class."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if i < n and pattern[i] == "*":
                i += 1
                if i < n and pattern[i] == "/":
                    i += 1
                    out.append("(.*/)?")
                else:
                    out.append(".*")
            else:
                out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + (i < n and pattern[i] == "!")
            j += j < n and pattern[j] == "]"
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape("["))
                continue
            body = pattern[i:j].replace("\\", "\\\\").replace("/", "")
            i = j + 1
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\" + body
            out.append(f"[{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def parse_rule(line: str) -> IgnoreRule | None:
    """One .gitignore line -> rule (None for blanks and comments), with prime's matcher's semantics."""
    if not line.strip() or line.startswith("#"):
        return None
    negated = line.startswith("!")
    pat = line[1:] if negated else line
    # runs of `*` glued to other characters act as a single `*`
    pat = re.sub(r"([^/])\*{2,}", r"\1*", pat)
    pat = re.sub(r"\*{2,}([^/])", r"*\1", pat)
    if not pat or pat.rstrip() == "/":
        return None
    dir_only = pat.endswith("/")
    anchored = "/" in pat[:-1]
    pat = pat.removeprefix("/")
    if pat.startswith("**"):
        pat, anchored = pat[2:], False
    pat = pat.removeprefix("/").removesuffix("/")
    if not pat:
        return None
    if pat[0] == "\\" and pat[1:2] in ("#", "!"):
        pat = pat[1:]
    if pat.endswith(" "):  # trailing spaces go, unless the last one is escaped
        bare = pat.rstrip(" ")
        pat = bare[:-1] + " " if bare.endswith("\\") else bare
    head = "^" if anchored else "(^|/)"
    # a directory rule also matches everything below it; a negated one never matches a plain path
    tail = "$" if not dir_only else ("/$" if negated else "($|/)")
    return IgnoreRule(re.compile(head + _glob_to_regex(pat) + tail), negated)


def gitignore_matcher(root: Path) -> Callable[[Path], bool] | None:
    """The root `.gitignore` as a predicate over paths under `root` (last matching rule wins)."""
    path = root / ".gitignore"
    if not path.exists():
        return None
    rules = [r for line in path.read_text().splitlines() if (r := parse_rule(line))]

    def ignored(p: Path) -> bool:
        rel = Path(os.path.abspath(p)).relative_to(os.path.abspath(root)).as_posix()
        for rule in reversed(rules):
            if rule.regex.search(rel):
                return not rule.negated
        return False

    return ignored


def _file_ok(p: Path) -> bool:
    return p.is_file() and not p.is_symlink() and not p.name.startswith(".")


def _dir_ok(p: Path) -> bool:
    return p.is_dir() and not p.name.startswith(".") and p.name not in SKIP_DIRS and not p.name.endswith(".egg-info")


def collect_files(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of every file the archive and hash cover, sorted by path."""
    ignored = gitignore_matcher(root) or (lambda p: False)
    found: dict[str, Path] = {}

    def add(p: Path) -> None:
        if _file_ok(p) and "__pycache__" not in p.relative_to(root).parts and not ignored(p):
            found[p.relative_to(root).as_posix()] = p

    for pattern in TOP_LEVEL_PATTERNS:
        for p in root.glob(pattern):
            add(p)
    for sub in sorted(root.iterdir()):
        if not _dir_ok(sub) or ignored(sub):
            continue
        for dirpath, dirnames, filenames in os.walk(sub):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if _dir_ok(here / d) and not ignored(here / d))
            for name in filenames:
                add(here / name)
    return sorted(found.items())


def content_hash(root: Path) -> str:
    """The hub's content hash of an environment directory (identical to `prime env push`'s)."""
    h = hashlib.sha256()
    for rel, path in collect_files(root):
        h.update(f"file:{rel}".encode())
        h.update(path.read_bytes())
    return h.hexdigest()
