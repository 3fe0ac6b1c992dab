"""No silent hangs (issues 37, 46), the supervisor's side: when has the run stalled, and who stopped it.

`rl`'s supervisor (utils/supervise.py) reads the progress files its processes keep (utils/watchdog.py)
and applies the limit of the run's phase:
- start, until every driving process (trainers, orchestrators) is up: `startup_s` (a model's
  conversion, vLLM's start);
- first, from then until a step gap is known: `first_batch_s` (a reward call, an environment's first
  episode: short), where a finished rollout counts as progress too;
- steady: max(`floor_s`, `factor` x the slowest step so far), a gap that spans a stall already said
  left out.
Past the limit it asks every process for its stacks and what it waits on, and names the innermost
cause: a process stopped by a signal (state T in /proc/<pid>/stat), one that does not answer, or,
following each process's oldest wait from peer to peer (the trainer waits on the orchestrator, the
orchestrator on inference or on an environment's reward function), the one stuck in its own code
or the outside call it waits on. A call with its own timeout still running is said and left to it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

GRACE_S = 10.0  # after a call's own timeout, before the stall is looked at again
ANSWER_S = 5.0  # how long a process has to write its stacks
PEERS = ("inference", "trainer", "orchestrator")  # what a wait names when it waits on another process of the run
STATES = {"D": "waiting in the kernel (a disk, a driver)", "R": "running, in native code", "S": "sleeping, in native code",
          "T": "stopped",
          "Z": "exited, not yet reaped"}


@dataclass
class Watch:
    """The progress files in `where`, the thresholds from `[watchdog]`; `drivers` the processes whose
    start and steps set the phase (trainers and orchestrators)."""

    where: Path
    factor: float
    floor_s: float
    startup_s: float
    first_batch_s: float = 120.0
    drivers: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.time)
    seen: dict[str, dict] = field(default_factory=dict)  # process -> its progress record
    slowest_s: float = 0.0  # the slowest step gap seen so far
    said: list[float] = field(default_factory=list)  # when stalls were said (a gap spanning one is no step)
    quiet_until: float = 0.0  # silence counts from here (a stall said, or left to a call's own timeout)

    def poll(self) -> None:
        for path in self.where.glob("*.progress"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced right now
            self.seen[path.stem] = record
            for end, gap in record.get("gaps", []):
                if not any(end - gap < t < end for t in self.said):
                    self.slowest_s = max(self.slowest_s, gap)

    def _last(self, name: str) -> float:
        r = self.seen.get(name, {})
        return max((r.get(k) or 0.0) for k in ("ready", "step", "active", "time"))

    def phase(self) -> str:
        drivers = self.drivers or set(self.seen)
        if not drivers or any(not (self.seen.get(d, {}).get("ready") or self.seen.get(d, {}).get("steps")) for d in drivers):
            return "start"
        return "steady" if self.slowest_s > 0 else "first"

    def limit_s(self) -> float:
        """How long the run may go without any process advancing, in its phase."""
        phase = self.phase()
        if phase == "start":
            return self.startup_s
        if phase == "first":
            return self.first_batch_s
        return max(self.floor_s, self.factor * self.slowest_s)

    def limit_words(self) -> str:
        phase = self.phase()
        if phase == "start":
            return "until every process is up: watchdog.startup_s"
        if phase == "first":
            return "for the first steps: watchdog.first_batch_s"
        return (f"steady: the larger of watchdog.floor_s and watchdog.factor x the slowest step, "
                f"{self.factor:g} x {self.slowest_s:.1f} s")

    def silent_s(self) -> float:
        last = max((self._last(n) for n in self.seen), default=0.0)
        return time.time() - max(last, self.started, self.quiet_until)

    def stalled(self) -> bool:
        self.poll()
        return self.silent_s() > self.limit_s()

    def hush(self, until: float) -> None:
        """A stall was said (or left to a call's timeout): silence counts again from `until`."""
        self.said.append(time.time())
        self.quiet_until = until

    def blame(self, names: list[str]) -> str:
        """The process that advanced longest ago (one that never did, first)."""
        return min(names, key=lambda n: self._last(n) if n in self.seen else 0.0)


@dataclass
class Wait:
    since: float
    until: float | None
    on: str
    what: str
    where: str


@dataclass
class Answer:
    """What one process (all its pids: a trainer's launcher and ranks) said when asked."""

    places: dict[str, str] = field(default_factory=dict)  # "<name>-<pid>" -> the place in its WHERE line
    waits: list[Wait] = field(default_factory=list)
    running: bool = False  # its event loop is blocked in its own code: its open waits say nothing
    silent: list[str] = field(default_factory=list)  # "<name>-<pid>" that did not answer


def proc_state(pid: int) -> str:
    """The state letter in /proc/<pid>/stat ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def registered(where: Path) -> dict[str, int]:
    """"<name>-<pid>" -> pid of every process that handles the stack signals (utils/watchdog.py install)."""
    out = {}
    for pid_file in where.glob("*.pid"):
        try:
            out[pid_file.stem] = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
    return out


def ask_stacks(where: Path, skip: set[int] = frozenset(), wait_s: float = ANSWER_S) -> dict[str, Answer]:
    """Every registered process's stacks and waits, asked for now, by process name. One that does not
    answer within `wait_s` (blocked in native code) gets faulthandler's SIGUSR2 dump. `skip`: pids
    that cannot answer (stopped)."""
    asked, t0, answers = {}, time.time(), {}
    for me, pid in registered(where).items():
        if pid in skip:
            continue
        try:
            os.kill(pid, signal.SIGUSR1)
            asked[me] = where / f"{me}.stacks"
        except OSError:  # gone
            (where / f"{me}.pid").unlink(missing_ok=True)
    got: dict[str, list[str]] = {}
    while len(got) < len(asked) and time.time() - t0 < wait_s:
        for me, path in asked.items():
            if me not in got and path.exists() and path.stat().st_mtime >= t0 - 1:
                text = path.read_text().splitlines()
                if text and text[0].startswith("WHERE "):
                    got[me] = text
        time.sleep(0.1)
    for me in asked:
        a = answers.setdefault(me.rpartition("-")[0], Answer())
        if me not in got:
            a.silent.append(me)
            continue
        a.places[me] = got[me][0].removeprefix("WHERE ")
        a.running |= got[me][1:2] == ["RUNNING"]
        for line in got[me][1:]:
            if line.startswith("WAIT\t"):
                _, since, until, on, what, at = (line.split("\t") + [""] * 6)[:6]
                a.waits.append(Wait(float(since), None if until == "-" else float(until), on, what, at))
    for me in {m for a in answers.values() for m in a.silent}:
        try:
            os.kill(int((where / f"{me}.pid").read_text()), signal.SIGUSR2)
        except (OSError, ValueError):
            pass
    return answers


def place(places: dict[str, str]) -> str:
    """Where a process is stuck, from its pids' places (a trainer's: the rank's, not its launcher's wait)."""
    mine = [w for _, w in sorted(places.items())]
    inner = [w for w in mine if "entrypoints" not in w and not w.startswith(("trainer.py", "rl.py"))]
    return (inner or mine or ["an unknown place (it gave no stacks)"])[0]


def _silent(name: str, a: Answer, where: Path) -> str:
    """A process that gave no Python stack: faulthandler's dump where it wrote one, else its state."""
    time.sleep(1.0)  # SIGUSR2's dump is written by the signal handler in C, at once: a second is plenty
    for me in a.silent:
        if (where / f"{me}.faults").exists() and (where / f"{me}.faults").stat().st_size > 0:
            return f"{name} stopped in native code (no Python stack answered: see {me}.faults)"
    me = a.silent[0]
    state = proc_state(int(me.rpartition("-")[2]))
    return (f"{name} stopped answering: no Python stack in {ANSWER_S:g} s and nothing from faulthandler "
            f"(state {state or '?'} in /proc/{me.rpartition('-')[2]}/stat: {STATES.get(state, 'gone')})")


@dataclass
class Verdict:
    blamed: str  # the process named (whose output stays on the console while the run stops)
    cause: str  # the words naming it
    until: float | None = None  # a call with its own timeout: it ends by then


def diagnose(watch: Watch, pids: dict[str, int], drivers: list[str]) -> Verdict:
    """Who stopped the run: `pids` the supervisor's processes by name, `drivers` those driving it."""
    mine = {name: [p for me, p in registered(watch.where).items() if me.rpartition("-")[0] == name] + [pid]
            for name, pid in pids.items()}
    stopped = [(name, p) for name, ps in mine.items() for p in ps if proc_state(p) in ("T", "t")]
    answers = ask_stacks(watch.where, {p for _, p in stopped})
    if stopped:
        name, pid = stopped[0]
        return Verdict(name, f"{name} is stopped (state T in /proc/{pid}/stat: SIGSTOP, Ctrl-Z or a debugger; "
                             f"`kill -CONT {pid}` resumes it)")
    name, seen = watch.blame(drivers or list(pids)), {}
    while True:
        a = answers.get(name)
        if a is None:
            return Verdict(name, f"{name} stopped in an unknown place (it gave no stacks)")
        if a.silent and not a.places:
            return Verdict(name, _silent(name, a, watch.where))
        waits = sorted(a.waits, key=lambda w: w.since)
        if a.running or not waits:
            return Verdict(name, f"{name} stopped in {place(a.places)}")
        w = waits[0]
        prefix = name[: len(name) - len(name.rpartition("-")[2])] if "-" in name else ""
        peer = next((p for p in (prefix + w.on, w.on) if w.on in PEERS and p in pids), None)
        if peer is None:
            at = f" ({w.where})" if w.where else ""
            return Verdict(name, f"{name} waiting {time.time() - w.since:.0f} s on {w.on}{at}", w.until)
        if peer in seen:  # each waits on the other: what passes between them (weights through inference) is lost
            return Verdict(peer, f"{name} waits on {peer} ({w.what}) and {peer} on {name} ({seen[peer].what}): "
                                 f"what passes between them is lost (their logs, and inference's, say more)")
        seen[name] = w
        name = peer
