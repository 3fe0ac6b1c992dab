"""The import structure of `composer_prime/`: no import circle, and no import upward or sideways
across the declared layers (read from the source with `ast`; nothing is imported).

Every import counts, also one inside a function: a lazy import still makes the importing module
depend on the imported one. The layers, lowest first; a module may import its own unit and any
lower layer. Units in one layer are separate processes (or the runtime they share) and import
each other only through a declared contract.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

LAYERS: list[set[str]] = [
    {"contract"},  # what crosses a process boundary: importable by every unit, imports none
    {"utils"},
    {"transports"},
    {"config"},
    {"model"},
    {"env_runtime"},  # running environments (the orchestrator and the hub tooling use it)
    {"traces"},  # agent traces: ingest, replay, pairs, datasets (reads tool calls as the environments write them)
    {"inference", "trainer", "orchestrator"},
    {"hub"},  # `composer-prime env ...`: scaffold, validate, eval, build, publish, install
    {"entrypoints"},
]

# A unit may import these modules of a peer: none, now that what crosses a process is the contract's.
CONTRACTS: dict[str, set[str]] = {}

# Upward imports being removed on other branches; each entry goes when its fix merges (the test
# fails on an entry that no longer occurs, so the list cannot go stale).
KNOWN: set[tuple[str, str]] = set()


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(root: Path) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a module of the package named like `root`."""
    mods, package = modules(root), root.name
    edges = set()
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                # `from pkg import mod` depends on pkg.mod; the parent package's __init__ runs for any
                # import of pkg.mod, so it is no edge of its own (as with `import pkg.mod`)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target not in mods and "." in target:  # `from pkg.mod import name`: the module
                    target = target.rpartition(".")[0]
                if target in mods and target != name and target.startswith(package + "."):
                    edges.add((name, target))
    return edges


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def unit(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def upward(edges: set[tuple[str, str]], layers: list[set[str]], contracts: dict[str, set[str]]) -> set[tuple[str, str]]:
    rank = {u: i for i, layer in enumerate(layers) for u in layer}
    bad = set()
    for a, b in edges:
        ua, ub = unit(a), unit(b)
        if ua == ub or not ua or not ub:
            continue
        if ua not in rank or ub not in rank:
            bad.add((a, b))  # a new top-level package must be given a layer
        elif rank[ub] >= rank[ua] and not any(b.startswith(c) and ua in who for c, who in contracts.items()):
            bad.add((a, b))
    return bad


def test_composer_prime_has_no_import_circle():
    assert circles(imports(ROOT / "composer_prime")) == []


def test_composer_prime_imports_only_downward():
    bad = upward(imports(ROOT / "composer_prime"), LAYERS, CONTRACTS)
    assert sorted(bad - KNOWN) == [], "upward or sideways imports"
    assert sorted(KNOWN - bad) == [], "fixed: remove these from KNOWN"


def test_the_checks_find_a_circle_and_an_upward_import(tmp_path):
    pkg = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", "low/__init__.py": "", "high/__init__.py": "",
                      "low/a.py": "def f():\n    from pkg.high import b\n",  # lazy: still an edge
                      "low/c.py": "from . import a\n",
                      "high/b.py": "from pkg.low.c import x\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    edges = imports(pkg)
    assert edges == {("pkg.low.a", "pkg.high.b"), ("pkg.low.c", "pkg.low.a"), ("pkg.high.b", "pkg.low.c")}
    assert circles(edges) == [["pkg.high.b", "pkg.low.a", "pkg.low.c"]]
    assert upward(edges, [{"low"}, {"high"}], {}) == {("pkg.low.a", "pkg.high.b")}
    assert upward(edges, [{"low", "high"}], {}) == {("pkg.low.a", "pkg.high.b"), ("pkg.high.b", "pkg.low.c")}  # peers
    assert upward(edges, [{"low", "high"}], {"pkg.low.c": {"high"}, "pkg.high": {"low"}}) == set()  # contracts
