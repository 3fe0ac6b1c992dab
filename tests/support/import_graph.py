"""The import graph of a package, read from its source with `ast` (nothing is imported), and the
two checks made on it: circles, and imports against the direction of a declared order.

An edge (importer, imported) is a module of the package naming another in:
- `import a.b` and `from a.b import name`: a.b (the module that holds the name);
- `from a import b` with b a submodule (and `import a.b as b`): a.b, and a itself, because the
  name b is looked up on package a (so does `from a import name`: an edge to a). A package
  whose `__init__` re-exports a submodule that imports the package back is a circle: Python
  gets through it while the names imported back are submodules (it loads them on the fly), and
  fails or not by the order of the `__init__`'s lines once one is a re-exported name;
- `importlib.import_module("a.b")` and `__import__("a.b")`: a.b; with an f-string, every module
  of the package whose name fits it (`f"a.{name}"`: any module under a).
The parent packages an import runs implicitly are no edge of their own: otherwise every
`__init__` that re-exports its submodules (config's) would sit in a circle with each of them
that imports a sibling.

Every import counts, also one inside a function or under `if TYPE_CHECKING:`: a lazy import still
makes the importing module depend on the imported one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root` (a package is its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _loaded(node: ast.Call, mods: dict[str, Path]) -> list[str]:
    """What `importlib.import_module(...)` or `__import__(...)` with a literal first argument loads."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr):  # the literal parts as they are, each placeholder any dotted name
        pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"[\w.]+" for v in arg.values)
        return [m for m in mods if re.fullmatch(pattern, m)]
    return []


def _named(node: ast.AST, here: str, mods: dict[str, Path]) -> Iterator[str]:
    """The modules an import statement or a literal load names (see the module docstring)."""
    if isinstance(node, ast.Import):
        for a in node.names:
            yield a.name
            if a.asname and "." in a.name:  # `import a.b as b` looks b up on package a, as `from a import b` does
                yield a.name.rpartition(".")[0]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parent = here.split(".")[: len(here.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        for a in node.names:
            if f"{base}.{a.name}" in mods:
                yield f"{base}.{a.name}"
            yield base
    elif isinstance(node, ast.Call):
        yield from _loaded(node, mods)


def imports(root: Path) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a module of the package at `root` by another."""
    mods, package = modules(root), root.name
    edges = set()
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _named(node, here, mods):
                while target not in mods and "." in target:  # `from pkg.mod import name`: the module
                    target = target.rpartition(".")[0]
                if target in mods and target != name and (target + ".").startswith(package + "."):
                    edges.add((name, target))
    return edges


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
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
    return sorted(found)


def unit(module: str) -> str:
    """The top-level package a module belongs to ("trainer" for pkg.trainer.loss.rl); "" for the root."""
    return module.split(".")[1] if module.count(".") else ""


def against_order(edges: set[tuple[str, str]], order: list[tuple[str, ...]]) -> set[tuple[str, str]]:
    """The edges that go against `order` (levels of top-level packages, lowest first): a module may
    import its own package and any package of a lower level, nothing else (not a peer on its own
    level, nothing higher). A package missing from `order` may import nothing and be imported by nothing."""
    level = {u: i for i, peers in enumerate(order) for u in peers}
    bad = set()
    for a, b in edges:
        ua, ub = unit(a), unit(b)
        if ua == ub or not ub:  # its own package, or the root package (which holds no code)
            continue
        if ua not in level or ub not in level or level[ub] >= level[ua]:
            bad.add((a, b))
    return bad
