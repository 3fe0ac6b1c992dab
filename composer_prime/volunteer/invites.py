"""Invites: one join token per volunteer, issued by the run's operator, stored hashed (issue 36).

A run's pool admits a worker only with a token the operator gave it (`composer-prime volunteers
invite NAME --run OUTPUT_DIR`), unless the run is open (`volunteers.open`: one token for anyone).
An invite is an identity: every key that joins with it is that volunteer's, and ejecting any of
them revokes the invite and ejects them all, so a fresh key with the same token is refused. The
store is `<output_dir>/orchestrator/invites.json`, a name per invite:

    {"alice": {"sha256": "<hex of the token>", "created": 1795000000.0, "revoked": null}}

Only the token's sha256 is kept (a token is 32 random bytes: no salt or slow hash needed); the
token itself is printed once, or written to the file `--out` names (mode 0600), with the pool's
certificate pinned after a dot (volunteer/tls.py). Writes go through
a lock and a rename, so the operator's commands and the running pool never see half a file; the
pool reads the file again whenever it changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class InviteError(ValueError):
    """A name taken or unknown, a malformed store: one line for the operator."""


def store_path(output_dir: Path) -> Path:
    return Path(output_dir) / "orchestrator" / "invites.json"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Invites:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen: tuple[float, int] | None = None  # the file's (mtime, size) when last read
        self._table: dict[str, dict] = {}

    def table(self) -> dict[str, dict]:
        """The invites as stored now (read again only when the file changed)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._seen, self._table = None, {}
            return self._table
        if self._seen != (st.st_mtime, st.st_size):
            try:
                table = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise InviteError(f"{self.path}: not an invites file ({e})") from None
            if not isinstance(table, dict) or not all(isinstance(v, dict) and "sha256" in v for v in table.values()):
                raise InviteError(f"{self.path}: not an invites file (a name per invite, each with its sha256)")
            self._seen, self._table = (st.st_mtime, st.st_size), table
        return self._table

    def find(self, token: str) -> tuple[str, dict] | None:
        """The invite `token` (its secret; a pinned certificate after a dot is the worker's) belongs to,
        revoked or not, compared in constant time."""
        digest = token_hash(token.strip().partition(".")[0])
        for name, entry in self.table().items():
            if hmac.compare_digest(str(entry["sha256"]), digest):
                return name, entry
        return None

    def invite(self, name: str) -> str:
        """A new invite named `name`; returns its token (kept nowhere but in the caller's hands)."""
        if not NAME.match(name):
            raise InviteError(f"invite name {name!r}: letters, digits, '.', '_' or '-', at most 64")
        token = secrets.token_urlsafe(32)
        with self._editing() as table:
            if name in table:
                raise InviteError(f"an invite named {name!r} exists already (revoke it, or pick another name)")
            table[name] = {"sha256": token_hash(token), "created": time.time(), "revoked": None}
        return token

    def revoke(self, name: str, why: str) -> bool:
        """Revoke `name` (False if it was already); its keys are refused from the pool's next look."""
        if name not in self.table():  # said before anything is written
            raise InviteError(f"no invite named {name!r} (see `composer-prime volunteers list`)")
        with self._editing() as table:
            if name not in table:
                raise InviteError(f"no invite named {name!r} (see `composer-prime volunteers list`)")
            if table[name].get("revoked"):
                return False
            table[name] = {**table[name], "revoked": why, "revoked_at": time.time()}
        return True

    @contextlib.contextmanager
    def _editing(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._seen = None  # read what is there now, under the lock
            table = dict(self.table())
            yield table
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(table, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            self._seen = None
