"""Plug-ins by name: the entry points of a group (what installed packages register) plus modules
a config names ("module:Attribute"). How loss channels are found without the config layer
importing the trainer, and how a channel defined outside the package joins a run."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points
from typing import Any


def names(group: str) -> set[str]:
    """The names registered in `group`, read from the packages' metadata without importing them."""
    return {ep.name for ep in entry_points(group=group)}


def load(group: str, refs: list[str] = ()) -> dict[str, Any]:
    """{name: object}: every entry point of `group`, then each ref, named by its `name` attribute.
    A ref that cannot be imported is a ValueError naming it."""
    found = {ep.name: ep.load() for ep in entry_points(group=group)}
    for ref in refs:
        module, _, attr = ref.partition(":")
        try:
            obj = getattr(import_module(module), attr) if attr else None
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load plug-in '{ref}': {type(e).__name__}: {e}") from None
        if obj is None or not getattr(obj, "name", None):
            raise ValueError(f"plug-in '{ref}' must name a class with a `name` (module:Class)")
        found[obj.name] = obj
    return found
