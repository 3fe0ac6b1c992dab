"""Which run wrote a run directory, and whether `rl` may start a run there or resume it (issue 46).

Every run has an id: `rl` makes one at each fresh start, a resume keeps its checkpoints'. The id is
in each trainer checkpoint's DONE and each published weight step's STABLE (`{"step": N, "run": ID}`)
and in the orchestrator's checkpoint, `orchestrator/checkpoint.json` (`{"run": ID, "step": N}`: it
has made the batches of steps before N; its tasks are a pure function of the step, so that is all
of its position). Before any process starts, `rl` checks each trainer's output_dir:

- a new run into a directory that holds checkpoints is refused in one line (exit 2): they are
  another run's, and pruning and `--resume` would mix the two (an older run's step_150 outlived a
  new run's step_20, and `--resume` continued the old run). `--fresh` starts over: it deletes what a
  run resumes from or reports on (`clear`) and keeps the keys, the volunteers' invites and the logs;
- `--resume` continues from the newest checkpoint only where the processes agree on it: the
  orchestrator's checkpoint and the weights of that step are the same run's, the orchestrator is
  not behind the trainer, and the run has steps left; else one line says which is where and what to do.

Nothing here imports torch: `rl`'s checks run before any process starts and on every --dry-run.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from composer_prime.utils import steps

DONE = "DONE"  # a trainer checkpoint's marker, written last
STABLE = "STABLE"  # a published weight step's marker, written last
ORCHESTRATOR = Path("orchestrator") / "checkpoint.json"
# What `--fresh` deletes: every place a run keeps steps, metrics or its report (relays' and inference
# servers' SHARDCAST copies too, whose newest step would outrank the new run's first).
FRESH = ("checkpoints", "weights", "shardcast", "relay-*", "inference-*", "trainer/metrics.jsonl",
         "orchestrator/metrics.jsonl", "orchestrator/traces.jsonl", str(ORCHESTRATOR), "report.md", "summary.json",
         "reward.png", "segments.json")


class RunDirError(ValueError):
    """A run directory a run cannot start in or resume from, in one line."""


@dataclass(frozen=True)
class Resume:
    step: int  # the trainer's newest checkpoint: steps done
    weights: Path | None  # weights/step_<step>, where it is there for inference to start from
    run: str | None  # the run id (None: checkpoints from before run ids)


def new_id() -> str:
    return secrets.token_hex(4)


def who(run: str | None) -> str:
    return f"run {run}" if run else "a run from before run ids"


def checkpoints(run_dir: Path) -> list[tuple[int, str | None]]:
    """(step, run id) of every complete trainer checkpoint, oldest first."""
    return [(s, steps.run_of(p, DONE)) for s, p in steps.steps(Path(run_dir) / "checkpoints", DONE)]


def save_orchestrator(run_dir: Path, run: str | None, step: int) -> None:
    """The orchestrator's checkpoint: batches of the steps before `step` made (written before each is sent,
    so it is never behind a trainer checkpoint of the same run)."""
    path = Path(run_dir) / ORCHESTRATOR
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run": run, "step": step}))
    os.replace(tmp, path)


def orchestrator(run_dir: Path) -> tuple[str | None, int] | None:
    """(run id, step) of the orchestrator's checkpoint; None where there is none (or it cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / ORCHESTRATOR).read_text())
        return data.get("run"), int(data["step"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def check_new(run_dir: Path, fresh: bool) -> None:
    """A new run may start in `run_dir` only where it holds no checkpoint, or with `fresh` (cleared at launch)."""
    found = checkpoints(run_dir)
    if found and not fresh:
        step, run = found[-1]
        raise RunDirError(f"{run_dir} holds the checkpoints of another run ({who(run)}, newest step_{step}): "
                          "continue it with --resume, start over with --fresh (deletes its checkpoints, weights and "
                          "metrics), or choose another --output_dir")


def clear(run_dir: Path) -> list[str]:
    """`--fresh`: delete what an earlier run left to resume from or report on; returns what was deleted."""
    gone = []
    for pattern in FRESH:
        for path in sorted(Path(run_dir).glob(pattern)):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            gone.append(str(path.relative_to(run_dir)))
    return gone


def check_resume(run_dir: Path, max_steps: int) -> Resume | None:
    """Where `--resume` continues in `run_dir` (None: no checkpoint, it starts at step 0), or RunDirError
    where the trainer's newest checkpoint, the orchestrator's and the weights of that step disagree."""
    run_dir = Path(run_dir)
    found = checkpoints(run_dir)
    if not found:
        return None
    step, run = found[-1]
    ckpt = f"checkpoints/step_{step}"
    if step >= max_steps:
        raise RunDirError(f"--resume: {run_dir} holds a finished run ({who(run)}: {ckpt}, max_steps {max_steps}): "
                          "nothing to resume; raise --max_steps to train it further, or start over with --fresh")
    orch = orchestrator(run_dir)
    if orch is not None and (orch[0] != run or orch[1] < step):
        o_run, o_step = orch
        # the newest checkpoint the orchestrator's record agrees with, and the ones in its way
        shared = [s for s, r in found if r == o_run and s <= o_step]
        newer = ", ".join(f"checkpoints/step_{s}" for s, _ in found if shared and s > shared[-1])
        todo = f"delete {newer} to resume {who(o_run)} from its step_{shared[-1]}, or " if shared else ""
        why = f"is {who(run)}'s" if o_run != run else f"is ahead of it (the orchestrator made batches up to step {o_step})"
        raise RunDirError(f"--resume: {run_dir}'s processes disagree: the orchestrator's checkpoint ({ORCHESTRATOR}: "
                          f"{who(o_run)}, step {o_step}) and the trainer's newest ({ckpt}, which {why}); "
                          f"{todo}start over with --fresh")
    weights = steps.step_path(run_dir / "weights", step)
    if (weights / STABLE).exists():
        if (w_run := steps.run_of(weights, STABLE)) != run:
            raise RunDirError(f"--resume: {run_dir}'s weights/step_{step} is {who(w_run)}'s, its {ckpt} {who(run)}'s: "
                              f"delete weights/step_{step} (the trainer publishes it again from the checkpoint), or "
                              "start over with --fresh")
        return Resume(step, weights, run)
    return Resume(step, None, run)
