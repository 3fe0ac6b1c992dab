"""What the operator sees of a running volunteer pool, with no import of the pool's server (issue 46).

The pool (volunteer/pool.py) writes its roster every beat to `<output_dir>/orchestrator/volunteers.json`:

    {"time": 1795000000.0, "heartbeat_s": 2.0, "members": [{"node": "<64 hex>", "invite": "my-laptop", "status": "healthy"}]}

`composer-prime volunteers revoke` reads it to say how many keys of the invite the running pool ejected
(the pool ejects them within a beat); a roster not written for a few beats means no pool is running.
`Stopping` keeps the pool's normal end quiet: uvicorn logs each request it cancels as an 'Exception in
ASGI application' with a CancelledError traceback, and at a run's end the workers' lease long-polls are
cut that way (ten lines a poll ended every successful volunteers run).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

NAME = "volunteers.json"  # beside invites.json
STALE_BEATS = 5  # a roster older than this many beats (and 5 s: a busy event loop beats late) is no running pool's


def write_roster(path: Path, members: Iterable, heartbeat_s: float) -> None:
    """Each member's node, invite and status, and when (atomically replaced)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"time": time.time(), "heartbeat_s": heartbeat_s,
                               "members": [{"node": m.node_id, "invite": m.invite, "status": m.status} for m in members]}))
    os.replace(tmp, path)


def read_roster(path: Path, now: float | None = None) -> dict | None:
    """The roster of the pool running now; None where none is (no file, unreadable, or not rewritten lately)."""
    try:
        roster = json.loads(Path(path).read_text())
        fresh = (time.time() if now is None else now) - roster["time"] <= STALE_BEATS * roster["heartbeat_s"] + 5.0
        return roster if fresh and isinstance(roster["members"], list) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Stopping(logging.Filter):
    """Drops uvicorn's record of a request cancelled once `stopping` is set (the pool's own end), only those."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        cancelled = record.exc_info is not None and isinstance(record.exc_info[1], asyncio.CancelledError)
        return not (self.stopping and cancelled)
