"""`--help` for every config entrypoint, generated from the pydantic models.

One section per sub-model (the dotted prefix you type on the command line), one row per field:
the flag, its type with its range, its description and its default. Nothing is written by hand,
so the help cannot drift from what the loader accepts.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from composer_prime.config.base import Sections
from composer_prime.utils import plugins

USAGE = "[@ FILE.toml ...] [--KEY VALUE ...] [--dry-run] [-h]"
SYNTAX = ("Files deep-merge left to right; `--a.b VALUE` overrides one key (VALUE is JSON, a TOML value or "
          "a plain string; `--flag` / `--no-flag` for booleans; `-` and `_` are alike in keys). A mistake is "
          "one line naming the key and where it came from, exit code 2.")
COMMON = [("--dry-run", "check the config, the model and the directories, start nothing (rl also writes "
                        "the resolved per-process configs)"),
          ("-h, --help", "show this help and exit")]


@dataclass(frozen=True)
class Section:
    """Marks a table of free-form keys that is validated later as `model` (as `RLConfig.trainer` is);
    `--help` documents it with that model's fields, leaving out `skip`."""

    model: type[BaseModel]
    skip: tuple[str, ...] = ()


def _unwrap(annotation: Any) -> Any:
    """`X | None` → X (the None is rendered by the caller)."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin in (Union, types.UnionType):
        return "|".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is list:
        return f"[{type_name(args[0])},...]" if args else "LIST"
    if origin is tuple:
        return "[" + ",".join(type_name(a) for a in args) + "]"
    if origin is dict or annotation is dict:
        return "TABLE"
    if hasattr(annotation, "__metadata__"):  # Annotated[int, Field(ge=0)] inside a list
        return type_name(args[0]) + _range(annotation.__metadata__)
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "PATH"
    return getattr(annotation, "__name__", str(annotation)).upper()


def _range(metadata: Any) -> str:
    bounds = []
    for m in metadata:
        for item in getattr(m, "metadata", [m]):  # a FieldInfo inside Annotated carries its own list
            for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "len>=")):
                if getattr(item, attr, None) is not None:  # annotated_types' Ge(ge=...), Gt(gt=...), ...
                    bounds.append(f"{op}{getattr(item, attr)}")
    return f" ({', '.join(bounds)})" if bounds else ""


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(exclude_defaults=True) for v in value]
    return f"default: {json.dumps(value, default=str)}"  # as it would be typed: JSON is a valid VALUE


def _sub_model(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field opens a section for, and how its keys are written."""
    inner = _unwrap(annotation)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return inner, ""
    if get_origin(inner) is list and get_args(inner):
        item = get_args(inner)[0]
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, "[*]"
    return None, ""


def collect(model: type[BaseModel], prefix: str = "", title: str = "options",
            skip: tuple[str, ...] = ()) -> list[tuple[str, list[tuple[str, str]]]]:
    """[(section title, [(flag, text), ...]), ...]: this model's section first, then its sub-models'."""
    rows: list[tuple[str, str]] = []
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        key = f"{prefix}{name}"
        marker = next((m for m in field.metadata if isinstance(m, Section)), None)
        sub, suffix = _sub_model(field.annotation)
        if marker is not None:
            note = f" Shared keys ({', '.join(marker.skip)}) come from the top level." if marker.skip else ""
            sections += collect(marker.model, f"{key}.", f"{key}: {_doc(marker.model)}{note}", marker.skip)
            continue
        if sub is not None and not suffix:
            sections += collect(sub, f"{key}.", f"{key}: {field.description or _doc(sub)}")
            continue
        flag = f"--{key} {type_name(field.annotation)}{_range(field.metadata)}"
        text = " ".join(t for t in (field.description or "", f"({_default(field)})" if _default(field) else "") if t)
        rows.append((flag, text))
        if sub is not None:  # a list of tables: its items' keys get their own section
            sections += collect(sub, f"{key}{suffix}.", f"{key}{suffix}: {_doc(sub)} (list items: a TOML array "
                                                        "of tables or JSON)")
    for name, config in plugin_sections(model).items():  # the sections installed plug-ins declare
        sections += collect(config, f"{prefix}{name}.", f"{prefix}{name}: {_doc(config)}")
    return [(title, rows), *sections]


def plugin_sections(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """{name: Config} of the installed plug-ins whose sections `model` holds (loss channels, batch steps)."""
    if not (isinstance(model, type) and issubclass(model, Sections)):
        return {}
    return {name: cls.Config for name, cls in sorted(plugins.load(model.GROUP).items()) if cls.Config.model_fields}


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())


def render(model: type[BaseModel], prog: str, width: int | None = None) -> str:
    width = width or max(60, min(120, shutil.get_terminal_size((100, 24)).columns))
    out = [f"usage: {prog} {USAGE}", "", *textwrap.wrap(_doc(model), width), "", *textwrap.wrap(SYNTAX, width)]
    for i, (title, rows) in enumerate(collect(model)):
        if i == 0:
            rows = rows + COMMON
        if not rows:
            continue
        out += ["", *textwrap.wrap(title, width)]
        flag_w = min(44, max(len(f) for f, _ in rows))
        for flag, text in rows:
            lines = textwrap.wrap(text, max(30, width - flag_w - 4), break_long_words=False,
                                  break_on_hyphens=False) or [""]  # paths and URLs stay whole
            if len(flag) > flag_w:
                out.append(f"  {flag}")
                out += [f"  {'':{flag_w}}  {line}" for line in lines]
            else:
                out.append(f"  {flag:{flag_w}}  {lines[0]}")
                out += [f"  {'':{flag_w}}  {line}" for line in lines[1:]]
    return "\n".join(out) + "\n"
