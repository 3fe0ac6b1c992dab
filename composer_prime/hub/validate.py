"""Model-free checks of an environment, after `vf-validate` (verifiers 0.4.0):

- **gold**: the reference solution must score. vf-validate runs `Task.validate(runtime)` after
  `Task.setup`; a Task that overrides it is checked that way here too (on verifiers' subprocess
  runtime). A text Task that keeps its reference in a TaskData `answer` field instead (the
  classic dataset column, as `reverse-text` does) has that answer scored as the reply and must
  reach `gold_min` (default 1.0). A task with neither cannot show that it is solvable: invalid.
- **no-op**: an untouched task (an empty reply) must not already pass: vf-validate calls it
  invalid at reward >= 1.0; here it must also score strictly below the gold answer, so a
  reward that ignores the reply fails.

Each call into the environment's code (a scoring, a `validate()` hook) runs in a `CallBox` under a
time limit (env_runtime/calls.py): one that never returns ends the command in one line naming the
task and the place it hung (`my_env/taskset.py:41 in reward`), not a wait with nothing said.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import verifiers.v1 as vf

from composer_prime.env_runtime.calls import CallBox, CallTimeout
from composer_prime.env_runtime.episode import open_session
from composer_prime.env_runtime.tasksets import score
from composer_prime.hub.errors import ToolError

SOLVED = 1.0  # vf-validate's bar: an untouched task reaching it "passes untouched"


@dataclass
class Check:
    index: int
    task_id: str
    gold_how: str  # "answer" | "validate()" | "none"
    gold: float | None = None  # reward of the gold answer (None for validate() or none)
    gold_ok: bool | None = None
    noop: float | None = None
    noop_ok: bool | None = None
    problem: str | None = None

    @property
    def valid(self) -> bool:
        checked = self.gold_ok is not None or self.noop_ok is not None
        return checked and self.gold_ok is not False and self.noop_ok is not False


def _has_validate_hook(task: vf.Task) -> bool:
    return type(task).validate is not vf.Task.validate


async def _gold_by_hook(task: vf.Task) -> bool | None:
    """vf-validate's gold check: setup, then the task's own `validate`, in a fresh runtime."""
    from verifiers.v1.runtimes import make_runtime
    from verifiers.v1.state import state_cls
    from verifiers.v1.utils.decorators import invoke

    runtime = make_runtime(vf.SubprocessConfig(), name=f"validate-gold-{task.data.idx}-{uuid.uuid4().hex[:8]}")
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     state=state_cls(type(task))(), agent=vf.AgentInfo(config=vf.AgentConfig(), name="validate"))
    runtime.env = dict(task.runtime_env())
    await runtime.start()
    try:
        await invoke(task.setup, {"trace": trace, "runtime": runtime})
        return await task.validate(runtime)
    finally:
        await runtime.stop()


async def _score(task: vf.Task, reply: str) -> float:
    """The orchestrator's scoring of a final reply; a task with tools gets a fresh session, as a
    rollout would, so rewards that read the session run."""
    session = await open_session(task)
    try:
        return (await score(task, reply, session))[0]
    finally:
        if session is not None:
            await session.close()


async def check_task(i: int, task: vf.Task, gold_min: float = SOLVED, box: CallBox | None = None) -> Check:
    """Task i's gold and no-op checks; each call in `box` when given (a call past its time: ToolError)."""

    async def boxed(make, fn: str, what: str):
        return await (make() if box is None else box.call(make, what, f"{box.name}'s {fn}"))

    answer = getattr(task.data, "answer", None)
    how = "validate()" if _has_validate_hook(task) else "answer" if answer is not None else "none"
    c = Check(i, str(task.data.id or task.data.name or i), how)
    problems: list[str] = []
    try:
        if not task.hooks("reward"):
            c.problem = "the task declares no @vf.reward"
            c.gold_ok = c.noop_ok = False
            return c
        if how == "validate()":
            if type(task).NEEDS_CONTAINER or task.data.image:
                c.gold_ok = False  # cannot be checked here; passing it silently would be worse
                problems.append("gold needs a container runtime (use vf-validate --runtime.type docker)")
            else:
                c.gold_ok = await boxed(lambda: _gold_by_hook(task), "validate() hook", "the gold solution")
                if c.gold_ok is False:
                    problems.append("Task.validate() rejected the gold solution")
        elif how == "answer":
            c.gold = await boxed(lambda: _score(task, str(answer)), "reward function", "the gold answer")
            c.gold_ok = c.gold >= gold_min
            if not c.gold_ok:
                problems.append(f"gold answer scores {c.gold:.3g} < {gold_min:g}")
        else:
            c.gold_ok = False
            problems.append("no gold: give the TaskData an `answer` field or override Task.validate()")
        c.noop = await boxed(lambda: _score(task, ""), "reward function", "an empty reply")
        c.noop_ok = c.noop < SOLVED and (c.gold is None or c.noop < c.gold)
        if c.gold is not None and c.noop == c.gold:
            problems.insert(0, f"reward ignores the reply: gold and no-op both score {c.noop:.3g}")
        elif c.noop >= SOLVED:
            problems.append(f"an empty reply already scores {c.noop:.3g}")
        elif not c.noop_ok:
            problems.append(f"an empty reply scores {c.noop:.3g}, not below the gold answer")
    except CallTimeout as e:  # a hang is no finding about the task: nothing after it would be checked
        raise ToolError(f"task {c.task_id} (#{i}): {e}") from None
    except Exception as e:  # noqa: BLE001 - a broken task is a finding, reported per task like vf-validate
        problems.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        c.gold_ok = False if c.gold_ok is None else c.gold_ok
        c.noop_ok = False if c.noop_ok is None else c.noop_ok
    c.problem = "; ".join(problems) or None
    return c


def _fmt(x: float | None, ok: bool | None) -> str:
    mark = {True: "ok", False: "FAIL", None: "-"}[ok]
    return f"{x:.3f} {mark}" if x is not None else mark


def table(checks: list[Check]) -> str:
    rows = [("#", "task", "gold", "no-op", "result")]
    for c in checks:
        gold = _fmt(c.gold, c.gold_ok) + (" (validate)" if c.gold_how == "validate()" else "")
        rows.append((str(c.index), c.task_id[:24], gold, _fmt(c.noop, c.noop_ok),
                     "valid" if c.valid else f"INVALID: {c.problem or 'nothing checked'}"))
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    return "\n".join("  ".join(r[k].ljust(widths[k]) for k in range(4)) + "  " + r[4] for r in rows)


def summary(env: str, checks: list[Check]) -> tuple[bool, str]:
    bad = [c for c in checks if not c.valid]
    if not bad:
        how = sorted({c.gold_how for c in checks})
        return True, f"OK: {env}: {len(checks)}/{len(checks)} tasks valid (gold via {', '.join(how)}; no-op below gold)"
    first = bad[0].problem or "nothing was checked"
    return False, f"FAILED: {env}: {len(bad)}/{len(checks)} tasks invalid; first: task {bad[0].task_id}: {first}"
