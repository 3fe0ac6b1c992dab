"""Load an environment's tasks from an installed id (`reverse-text`, `owner/name@1.0`) or from a
package directory that is not installed (`environments/my-env`), for validate and eval."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from composer_prime.hub.errors import ToolError


def _add_package_dir(root: Path) -> str:
    """Put the package directory of an uninstalled environment on sys.path; return its id."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ToolError(f"{root}: cannot read pyproject.toml ({e})") from None
    name = data.get("project", {}).get("name")
    if not name:
        raise ToolError(f"{root}/pyproject.toml has no [project] name")
    packages = data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {}).get("packages")
    for parent in {str((root / p).parent.resolve()) for p in packages or ["."]}:
        if parent not in sys.path:
            sys.path.insert(0, parent)
    return name


def load_env(env: str, args: dict[str, Any] | None = None, limit: int | None = None) -> tuple[str, list]:
    """(environment id, its first `limit` tasks); a one-line ToolError for anything a user got wrong."""
    from composer_prime.env_runtime.tasksets import EnvError, load_tasks

    path = Path(env)
    if path.is_dir() and (path / "pyproject.toml").exists():
        env = _add_package_dir(path)
    elif env.count("/") > 1:
        raise ToolError(f"{env} is neither an environment directory nor an id (name or owner/name[@version])")
    try:
        tasks = load_tasks(env, args or {})
    except EnvError as e:
        raise ToolError(str(e)) from None
    if not tasks:
        raise ToolError(f"environment {env!r} produced no tasks")
    return env, tasks[:limit] if limit else tasks


def taskset_args(text: str | None) -> dict[str, Any]:
    """`--args '{"split": "eval"}'` -> taskset config fields."""
    try:
        value = json.loads(text) if text else {}
    except ValueError as e:
        raise ToolError(f"--args is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ToolError("--args must be a JSON object of taskset config fields")
    return value
