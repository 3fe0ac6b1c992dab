"""Where a process's metrics go: `<output_dir>/<job>/metrics.jsonl`, and W&B when configured.

The JSONL file is what the report, the plot and the tests read: one row per step. With
`[wandb] mode = "online" | "offline"` every row's numbers also go to a Weights & Biases run:
one run per process (`<name>-trainer`, `<name>-orchestrator`) in one group, `step` as the
x-axis, so a resumed process (a new W&B run) continues the same curve. Offline runs stay in
`<dir>/wandb/offline-run-*` until `wandb sync`.
"""

from __future__ import annotations

import json
from pathlib import Path

from composer_prime.utils import watchdog


def keep_before(path: Path, step: int) -> None:
    """Forget rows of `step` and later: they are redone after a resume (step 0: a fresh file)."""
    if path.exists():
        rows = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < step]
        path.write_text("".join(r + "\n" for r in rows))


class MetricsLog:
    def __init__(self, output_dir: Path, job: str, resume_step: int = 0, wandb: dict | None = None,
                 config: dict | None = None) -> None:
        """`wandb`: the `[wandb]` section (mode, project, entity, name, dir); `config`: what the W&B run records."""
        self.path = Path(output_dir) / job / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep_before(self.path, resume_step)
        self.run = None
        if wandb is not None and wandb["mode"] != "disabled":
            import wandb as wb  # optional (`uv sync --extra wandb`); the config refuses the mode without it

            name = wandb.get("name")
            self.run = wb.init(project=wandb["project"], entity=wandb.get("entity"), mode=wandb["mode"],
                               name=f"{name}-{job}" if name else None, group=name or Path(output_dir).resolve().name,
                               job_type=job, dir=str(wandb.get("dir") or output_dir), config=config,
                               settings=wb.Settings(console="off"))  # our log lines stay as they are
            self.run.define_metric("step")
            self.run.define_metric("*", step_metric="step")

    def log(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        watchdog.advanced("step", row.get("step"))  # a trainer's step, an orchestrator's batch: the run moves
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})

    def rewind(self, step: int) -> None:
        """Steps from `step` on will be logged again (the trainer restarted there)."""
        keep_before(self.path, step)

    def close(self) -> None:
        if self.run is not None:
            import wandb as wb

            self.run.finish()
            # finish() only informs W&B's service process, which closes the run's transaction log later;
            # teardown waits for that, so the run is whole on disk when close() returns (a process killed
            # right after would otherwise leave a truncated offline run).
            wb.teardown()
