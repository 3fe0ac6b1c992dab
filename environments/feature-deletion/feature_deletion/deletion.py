"""Find functions in a module and delete them: replace a body with `raise NotImplementedError`
(decorators, signature and docstring kept), or remove a whole definition (a private helper).

Works on source text by line ranges from `ast`, so every byte outside the deleted lines
(formatting, comments, other functions) is left exactly as it was.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    qualname: str     # "func" or "Class.method" (nested classes: "Outer.Inner.method")
    lineno: int       # first line of the definition, decorators included
    end_lineno: int   # last line of the body
    body_start: int   # first line replaced by `raise NotImplementedError` (after signature/docstring)
    indent: str       # indentation of the body
    body_lines: int   # non-blank, non-comment lines in [body_start, end_lineno]
    calls: frozenset[str]  # names it calls: `f(...)` -> "f", `self.f(...)` / `cls.f(...)` -> ".f"

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def replaceable(self) -> bool:
        return self.body_start <= self.end_lineno


def find_functions(source: str) -> list[Function]:
    """Module-level functions and methods (of classes at any depth), in source order.
    Functions nested in functions are part of their parent, not listed."""
    lines = source.splitlines(keepends=True)
    out: list[Function] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(_describe(node, prefix + node.name, lines))

    visit(ast.parse(source).body, "")
    return out


def _describe(node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, lines: list[str]) -> Function:
    body = node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)
    header_end = body[0].end_lineno if has_doc else _signature_end(node, lines)
    first = body[1] if has_doc and len(body) > 1 else body[0]
    # A body sharing a line with the signature or docstring (`def f(): return 1`) is not
    # replaceable by whole lines: body_start > end_lineno marks it.
    start = header_end + 1 if first.lineno > header_end else node.end_lineno + 1
    if has_doc and len(body) == 1:
        start = node.end_lineno + 1
    line = lines[first.lineno - 1]
    indent = line[:len(line) - len(line.lstrip())]
    code = sum(1 for ln in lines[start - 1:node.end_lineno] if ln.strip() and not ln.strip().startswith("#"))
    calls = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Name):
                calls.add(sub.func.id)
            elif isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name) \
                    and sub.func.value.id in ("self", "cls"):
                calls.add("." + sub.func.attr)
    lineno = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return Function(qualname, lineno, node.end_lineno, start, indent, code, frozenset(calls))


def _signature_end(node: ast.AST, lines: list[str]) -> int:
    """Line of the ':' closing the `def` header (annotations may hold ':' inside brackets)."""
    text = "".join(lines[node.lineno - 1:node.body[0].lineno])
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.OP:
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            elif tok.string == ":" and depth == 0:
                return node.lineno + tok.start[0] - 1
    raise ValueError(f"no ':' ends the header of {getattr(node, 'name', '?')}")


def _trailing_comments(lines: list[str], end: int, indent: str) -> int:
    """Extend `end` over comment lines indented like the body: they are the body's comments."""
    while end < len(lines):
        s = lines[end]
        if not s.strip().startswith("#") or not s.startswith(indent) or len(s) - len(s.lstrip()) < len(indent):
            break
        end += 1
    return end


def replace_body(source: str, fn: Function) -> str:
    """`fn`'s body (everything after its signature and docstring) -> `raise NotImplementedError`."""
    if not fn.replaceable:
        raise ValueError(f"{fn.qualname}: body shares a line with its signature or docstring")
    lines = source.splitlines(keepends=True)
    end = _trailing_comments(lines, fn.end_lineno, fn.indent)
    nl = "\r\n" if lines[fn.body_start - 1].endswith("\r\n") else "\n"
    new = lines[:fn.body_start - 1] + [f"{fn.indent}raise NotImplementedError{nl}"] + lines[end:]
    return "".join(new)


def remove_function(source: str, fn: Function) -> str:
    """Remove `fn` entirely: decorators, comment lines right above it, its trailing blank lines."""
    lines = source.splitlines(keepends=True)
    start = fn.lineno - 1
    own_indent = lines[start][:len(lines[start]) - len(lines[start].lstrip())]
    while start > 0 and lines[start - 1].strip().startswith("#") and lines[start - 1].startswith(own_indent):
        start -= 1
    end = _trailing_comments(lines, fn.end_lineno, fn.indent)
    while end < len(lines) and not lines[end].strip():
        end += 1
    return "".join(lines[:start] + lines[end:])


def apply_deletions(source: str, edits: list[tuple[Function, str]]) -> str:
    """Apply ("body" | "remove", fn) edits bottom-up so earlier line numbers stay valid."""
    for fn, kind in sorted(edits, key=lambda e: e[0].lineno, reverse=True):
        source = replace_body(source, fn) if kind == "body" else remove_function(source, fn)
    ast.parse(source)  # the module must still be valid Python
    return source


def references(source: str) -> dict[str, list[int]]:
    """{identifier: [line...]} for every name used (loads, attributes, imports) in a module."""
    refs: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            refs.setdefault(node.id, []).append(node.lineno)
        elif isinstance(node, ast.Attribute):
            refs.setdefault(node.attr, []).append(node.lineno)
        elif isinstance(node, ast.alias):
            for name in (node.name.rsplit(".", 1)[-1], node.asname):
                if name:
                    refs.setdefault(name, []).append(node.lineno)
    return refs


def private_helpers(fn: Function, fns: list[Function], file: str,
                    refs: dict[str, dict[str, list[int]]]) -> list[Function]:
    """Private functions of `fn`'s module (or methods of its class) that only `fn` uses, directly
    or through another such helper. `fns`: the functions of `file`; `refs`: {file: references()}."""
    scope = fn.qualname.rpartition(".")[0]
    owned = [fn]
    changed = True
    while changed:
        changed = False
        for h in fns:
            if h in owned or h.qualname.rpartition(".")[0] != scope or not h.name.startswith("_") \
                    or h.name.endswith("__"):
                continue
            key = f".{h.name}" if scope else h.name
            if not any(key in o.calls for o in owned):
                continue
            inside = [*owned, h]
            if all(f == file and any(o.lineno <= ln <= o.end_lineno for o in inside)
                   for f, by_name in refs.items() for ln in by_name.get(h.name, [])):
                owned.append(h)
                changed = True
    return sorted(owned[1:], key=lambda h: h.lineno)
