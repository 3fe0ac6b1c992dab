"""Per-run cgroup v1 `pids` and `memory` groups: one cap on the whole sandbox, not per process.

RLIMIT_AS caps one process; a sandbox of N processes could still use N times that. Where this
process may create cgroups (root on a cgroup v1 host, as here) each run gets its own `pids` and
`memory` group, which also gives a second way to kill every member. Elsewhere (unprivileged, or
a cgroup v2 host where delegation rules make it fiddly) mode "auto" goes without and the
rlimits are the only caps; mode "require" fails instead.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Cgroups:
    dirs: list[Path] = field(default_factory=list)

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def members(self) -> set[int]:
        pids: set[int] = set()
        for d in self.dirs:
            try:
                pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return pids

    def destroy(self) -> None:
        """Kill every member, then remove the groups."""
        deadline = time.monotonic() + 5
        while (pids := self.members()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for d in self.dirs:
            for _ in range(100):  # rmdir is refused until the last member is reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _own_path(controller: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _create_v1(memory_mb: int, nproc: int) -> Cgroups:
    groups = Cgroups()
    name = f"fd-sandbox-{uuid.uuid4().hex[:12]}"
    try:
        for controller, settings in (
            ("pids", [("pids.max", str(nproc))]),
            ("memory", [("memory.swappiness", "0"), ("memory.limit_in_bytes", str(memory_mb << 20)),
                        ("memory.memsw.limit_in_bytes", str(memory_mb << 20))]),
        ):
            own = _own_path(controller)
            if own is None or not (V1_ROOT / controller).is_dir():
                raise OSError(f"no cgroup v1 {controller} controller")
            d = V1_ROOT / controller / own.lstrip("/") / name
            d.mkdir()
            groups.dirs.append(d)
            for fname, value in settings:
                if (d / fname).exists():  # memsw only exists with swap accounting
                    (d / fname).write_text(value)
    except OSError:
        groups.destroy()
        raise
    return groups


def create(memory_mb: int, nproc: int, mode: str) -> Cgroups:
    if mode == "off":
        return Cgroups()
    try:
        return _create_v1(memory_mb, nproc)
    except OSError as e:
        if mode == "require":
            raise RuntimeError(f"sandbox cgroups required but unavailable: {e}") from e
        return Cgroups()


def available() -> bool:
    try:
        create(64, 16, "require").destroy()
        return True
    except RuntimeError:
        return False
