"""One-line errors for the env commands: a user mistake or an unreachable hub never shows a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

# Exit codes: 1 = the command ran and the answer is "no" (validation failed, the hub refused);
# 2 = it could not run (bad input, missing package, unreachable hub).
REFUSED = 1
BAD_INPUT = 2


class ToolError(Exception):
    """An expected failure with a message fit for one line on stderr."""

    def __init__(self, message: str, code: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def one_line_errors(func: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's `func(args)`: a ToolError becomes one `error: ...` line."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            return func(*args, **kwargs)
        except ToolError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.code
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    return wrapper
