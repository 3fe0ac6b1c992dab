"""The tools' OpenAI function schemas and the argument checks made against them.

Error messages are specific on purpose (unknown tool, unknown or missing argument, wrong type):
they are shown to the model and collected for hint distillation.
"""

from __future__ import annotations

from typing import Any


class ToolError(Exception):
    """A bad call: becomes {"is_error": True, "content": message}."""


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


PATH = {"type": "string", "description": "path relative to the repository root"}
TOOLS: list[dict] = [
    _fn("list_dir", "List a directory of the repository (directories end with '/').",
        {"path": {**PATH, "default": "."},
         "depth": {"type": "integer", "description": "levels to show, 1-4", "default": 1}}, []),
    _fn("read_file", "Read a text file; each line is prefixed with its number and a tab.",
        {"path": PATH, "start_line": {"type": "integer", "description": "first line (from 1)"},
         "end_line": {"type": "integer", "description": "last line, inclusive"}}, ["path"]),
    _fn("write_file", "Create or overwrite a file with `content`.",
        {"path": PATH, "content": {"type": "string"}}, ["path", "content"]),
    _fn("edit", "Replace the exact text `old` (which must occur exactly once) with `new`.",
        {"path": PATH, "old": {"type": "string"}, "new": {"type": "string"}}, ["path", "old", "new"]),
    _fn("grep", "Search files for a Python regular expression; prints path:line: text.",
        {"pattern": {"type": "string"}, "path": {**PATH, "default": "."}}, ["pattern"]),
    _fn("run_tests", "Run pytest on test ids or files (default: the tests of the deleted function).",
        {"tests": {"type": "array", "items": {"type": "string"},
                   "description": "pytest node ids or test files"}}, []),
    _fn("submit", "Finish: your changes are scored. Call it once the tests pass.", {}, []),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TYPE_NAMES = {str: "string", int: "integer", list: "list", dict: "object", bool: "boolean", float: "number"}


def _type_ok(value: Any, spec: dict) -> bool:
    kind = spec["type"]
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return False


def check_arguments(name: Any, arguments: Any) -> dict:
    """The arguments to pass to tool `name`, or ToolError saying exactly what is wrong."""
    if not isinstance(name, str) or name not in SCHEMAS:
        raise ToolError(f"unknown tool {name!r}; the tools are: {', '.join(SCHEMAS)}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        got = TYPE_NAMES.get(type(arguments), type(arguments).__name__)
        raise ToolError(f"arguments of {name} must be a JSON object, got {got}")
    schema = SCHEMAS[name]
    props = schema["properties"]
    for key in arguments:
        if key not in props:
            expected = ", ".join(props) or "no arguments"
            raise ToolError(f"unknown argument {key!r} for {name} (expected: {expected})")
    for key in schema["required"]:
        if key not in arguments:
            raise ToolError(f"missing required argument {key!r} for {name}")
    for key, value in arguments.items():
        if not _type_ok(value, props[key]):
            want = "list of strings" if props[key]["type"] == "array" else props[key]["type"]
            got = TYPE_NAMES.get(type(value), type(value).__name__)
            raise ToolError(f"argument {key!r} of {name} must be a {want}, got {got}")
    return dict(arguments)
