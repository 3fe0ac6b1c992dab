"""What a hint template may contain, checked when the config loads (`orchestrator.distill.hints.templates`).

A template is a `str.format` string over the fields below; the hinter (orchestrator/hints.py)
fills them per error site. Checking here, at config time, turns what `str.format` would raise
mid-rollout into a config error.
"""

from __future__ import annotations

import string

FIELDS = ("detail", "name", "tools", "example")


def check_template(kind: str, template: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"hint template for {kind!r} is malformed: {e}") from None
    for f in fields:
        if f not in FIELDS:
            raise ValueError(f"hint template for {kind!r} has unknown field {{{f}}}; fields: {', '.join(FIELDS)}")
