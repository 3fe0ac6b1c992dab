"""Command line → validated config: `@ a.toml @ b.toml --x.y value --flag --no-flag --dry-run`.

Files deep-merge left to right, dotted flags override them. Any mistake (unknown key, wrong
type, out of range, bad file, a conflict, a model or directory this machine does not have)
becomes one line naming the key and where it came from, and the process exits with code 2: a
user should never read a traceback to fix a typo. `-h`/`--help` prints the options generated
from the models (config/help.py) and exits 0.

Why not prime-rl's own `prime-pydantic-config` (docs/running.md, "Config files and the command
line"): it keeps no record of which file set a key, so its errors cannot name it; it reads a list
value only as JSON (a TOML value such as `[{id = "x"}]` ends in a JSONDecodeError traceback) and
splits no comma lists; and its errors are multi-line boxes with exit code 1.
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, ValidationError

from composer_prime.config.base import FieldError
from composer_prime.config.help import render
from composer_prime.utils.net import bind_error

T = TypeVar("T", bound=BaseModel)
Check = Callable[[Any], None]  # raises ValueError or OSError saying what is wrong with the value it is given


class ConfigError(Exception):
    """A user-facing config mistake; the message is one line."""


def deep_merge(base: dict, new: dict, place: str, provenance: dict[str, str], prefix: str = "") -> dict:
    out = dict(base)
    for key, value in new.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, place, provenance, dotted + ".")
        else:
            out[key] = value
            record(provenance, dotted, value, place)
    return out


def record(provenance: dict[str, str], dotted: str, value: Any, place: str) -> None:
    """`place` set `dotted` to `value`. Only values are recorded, a table's key by key: a table
    composed from several places has no one place (the prefix of a key set elsewhere is not where
    it was set). What was recorded at, below or above `dotted` is replaced."""
    for k in [k for k in provenance if k == dotted or k.startswith(dotted + ".")]:
        del provenance[k]
    parts = dotted.split(".")
    for n in range(1, len(parts)):
        provenance.pop(".".join(parts[:n]), None)
    if isinstance(value, dict) and value:
        for k, v in value.items():
            record(provenance, f"{dotted}.{k}", v, place)
    else:
        provenance[dotted] = place


def alias(provenance: dict[str, str], source: str, target: str) -> None:
    """`target` was filled in from the value at `source`: it was set where that was."""
    for k, place in list(provenance.items()):
        if k == source or k.startswith(source + "."):
            provenance.setdefault(target + k[len(source):], place)


def place_of(loc: tuple | str, provenance: dict[str, str]) -> str:
    """Where the value at `loc` (dotted, or a validation error's location) was set: the place that
    set it, or every place that set a key of it (a table); inside a list, where the list was set."""
    parts = []
    for p in loc.split(".") if isinstance(loc, str) else loc:
        if isinstance(p, int):  # a list is set as a whole: its items were set where it was
            break
        parts.append(str(p))
    dotted = ".".join(parts)
    places = dict.fromkeys(v for k, v in provenance.items() if not dotted or k == dotted or k.startswith(dotted + "."))
    if places:
        return ", ".join(places)
    for n in range(len(parts) - 1, 0, -1):  # inside a value set whole (a list, an empty table)
        if (above := ".".join(parts[:n])) in provenance:
            return provenance[above]
    return "defaults"


def _parse_value(text: str) -> Any:
    """A command-line value: JSON, else a TOML value (`[{id = "x"}]`, as in the config files), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        if not isinstance(node.setdefault(p, {}), dict):
            raise ConfigError(f"{dotted}: cannot set a field inside '{p}', which is not a table (command line)")
        node = node[p]
    node[leaf] = value


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {getattr(e, 'strerror', None) or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


BARE = "command line, with no value"  # the provenance of a bare `--key`: on


def parse_argv(argv: list[str]) -> tuple[dict, dict[str, str], bool]:
    """Returns (raw tree, provenance of each dotted key, dry_run)."""
    tree: dict = {}
    provenance: dict[str, str] = {}
    dry_run = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "@" or (arg.startswith("@") and len(arg) > 1):
            if arg == "@":
                if i + 1 >= len(argv):
                    raise ConfigError("'@' must be followed by a TOML file")
                i += 1
                path = Path(argv[i])
            else:
                path = Path(arg[1:])
            tree = deep_merge(tree, read_toml(path), str(path), provenance)
        elif arg == "--dry-run":
            dry_run = True
        elif arg.startswith("--"):
            key = arg[2:].replace("-", "_")
            if "=" in key:
                key, text = key.split("=", 1)
                value = _parse_value(text)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and argv[i + 1] != "@":
                i += 1
                value = _parse_value(argv[i])
            elif key.split(".")[-1].startswith("no_"):
                *head, leaf = key.split(".")
                key, value = ".".join([*head, leaf[3:]]), False
            else:
                value = True
            _set_dotted(tree, key, value)
            record(provenance, key, value, BARE if value is True and "=" not in arg else "command line")
        else:
            raise ConfigError(f"unexpected argument '{arg}' (use '@ file.toml' or '--key value')")
        i += 1
    return tree, provenance, dry_run


_MISSING = object()


def check_bare_flags(config: BaseModel, provenance: dict[str, str], prefix: tuple = ()) -> None:
    """A bare `--key` means on, so it is only for on/off keys: `--max_steps` with its value forgotten was taken as
    max_steps = 1 (pydantic reads True as 1). Checked on each validated config (`prefix`: where it sits in the
    whole), where each key's type is known; a section still held as a table is checked when it is validated."""
    head = ".".join(prefix) + "." if prefix else ""
    for key in [k for k, where in provenance.items() if where == BARE and k.startswith(head)]:
        value: Any = config
        for part in key.removeprefix(head).split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else getattr(value, part, _MISSING)
        if value is not _MISSING and not isinstance(value, bool):
            raise ConfigError(f"--{key} was given no value (command line): write --{key} VALUE (a bare flag is only "
                              "for on/off keys)")


def validate(model: type[T], tree: dict, provenance: dict[str, str], prefix: tuple = ()) -> T:
    try:
        config = model.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        loc = (*prefix, *err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        if isinstance(cause := err.get("ctx", {}).get("error"), FieldError):  # a model's check names its key
            loc, msg = (*loc, *cause.key.split(".")), cause.message
        key = ".".join(str(p) for p in loc) or model.__name__
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        if err["type"] == "missing":
            raise ConfigError(f"{key}: required; set it in a config file or with --{key}{more}") from None
        raise ConfigError(f"{key}: {msg} ({place_of(loc, provenance)}){more}") from None
    check_bare_flags(config, provenance, prefix)
    return config


def check(config: BaseModel, checks: dict[str, Check], provenance: dict[str, str], prefix: str = "") -> None:
    """Run each check on the value at its dotted key; a failure names the key and where it was set."""
    for key, fn in checks.items():
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part)
        if value is None:
            continue
        try:
            fn(value)
        except (ValueError, OSError) as e:
            raise ConfigError(f"{prefix}{key}: {e} ({place_of(prefix + key, provenance)})") from None


def check_binds(binds: list[tuple[str, str, int]], provenance: dict[str, str], prefix: str = "") -> None:
    """Ports a process is about to listen on must be free: one line now, not a traceback later."""
    for key, host, port in binds:
        if error := bind_error(host, port):
            where = place_of(prefix + key.split(" ")[0], provenance)  # "port + 1000 (vLLM's server)" was set with port
            raise ConfigError(f"{prefix}{key}: cannot listen on {host}:{port} ({error}); is another run using it? ({where})")


def load(model: type[T], argv: list[str], checks: dict[str, Check] | None = None) -> tuple[T, dict[str, str], bool]:
    """argv → (config, where each key came from, dry_run). `--help` prints and exits 0."""
    if "-h" in argv or "--help" in argv:
        sys.stdout.write(render(model, Path(sys.argv[0]).stem))  # `rl`, or `rl.py` under python -m
        raise SystemExit(0)
    tree, provenance, dry_run = parse_argv(argv)
    config = validate(model, tree, provenance)
    check(config, checks or {}, provenance)
    return config, provenance, dry_run


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A ConfigError inside becomes `config error: ...` on stderr and exit code 2."""
    try:
        yield
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def load_or_exit(model: type[T], argv: list[str] | None = None, checks: dict[str, Check] | None = None,
                 ports: bool = False) -> tuple[T, bool]:
    """`load` with one-line errors; with `ports`, a run (not a dry run) also checks that `config.binds()` are free."""
    with one_line_errors():
        config, provenance, dry_run = load(model, sys.argv[1:] if argv is None else argv, checks)
        if ports and not dry_run:
            check_binds(config.binds(), provenance)  # type: ignore[attr-defined]
    return config, dry_run


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def write_toml(config: BaseModel, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(_drop_none(config.model_dump(mode="json"))))
