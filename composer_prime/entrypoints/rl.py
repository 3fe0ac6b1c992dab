"""`uv run rl @ config.toml`: resolve one config, start inference, trainer and orchestrator (and relays;
with `[diloco]`, one such group per island and a lighthouse).

Checks everything it can before starting anything (config, model, output directory, cores,
ports, whose run the output directory holds and whether --resume can continue it: utils/run_dir.py;
one line and exit code 2), writes each process's resolved config to <output_dir>/configs/
(each runs alone from it, e.g. on another machine), then runs them under utils/supervise.py:
logs in <output_dir>/logs/, all stopped when one fails, the console ending with its own line.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable

from composer_prime.config import ConfigError, RLConfig, write_toml
from composer_prime.config.loader import check, check_binds, load, one_line_errors, place_of
from composer_prime.config.plan import Process, plan, plan_islands
from composer_prime.entrypoints import checks
from composer_prime.model.resolve import decoder_layers, resolve_model
from composer_prime.transports import auth
from composer_prime.utils import prefork, report_segments, run_dir
from composer_prime.utils.logs import setup
from composer_prime.utils.report import metrics_rows, resumed_words, write_report
from composer_prime.utils.proc import run_main
from composer_prime.utils.supervise import supervise
from composer_prime.utils.watch import Watch

log = logging.getLogger(__name__)


def run_dirs(cfg: RLConfig, provenance: dict[str, str]
             ) -> tuple[dict[Path, run_dir.Resume | None], Callable[[Path], tuple[int, Path] | None]]:
    """Where each trainer's output_dir resumes (filled as planning asks, by `resume_of`), and `resume_of`:
    the --resume check of one directory, whose disagreement is one line (utils/run_dir.py)."""
    if cfg.resume and cfg.fresh:
        raise ConfigError(f"fresh: --fresh starts over and --resume continues; give one ({place_of('fresh', provenance)})")
    resumes: dict[Path, run_dir.Resume | None] = {}

    def resume_of(where: Path) -> tuple[int, Path] | None:
        try:
            found = resumes[Path(where)] = run_dir.check_resume(Path(where), cfg.max_steps)
        except run_dir.RunDirError as e:
            raise ConfigError(str(e)) from None
        return (found.step, found.weights) if found is not None and found.weights is not None else None
    return resumes, resume_of


def own_runs(cfg: RLConfig, processes: list[Process], resumes: dict[Path, run_dir.Resume | None],
             provenance: dict[str, str]) -> None:
    """A new run only into directories without another run's checkpoints (or --fresh); every trainer and
    orchestrator told its run id: the resumed checkpoints', else a new one."""
    new = run_dir.new_id()
    for p in processes:
        if p.entrypoint not in ("trainer", "orchestrator"):
            continue
        where = Path(p.config.output_dir)
        if not cfg.resume and p.entrypoint == "trainer":
            try:
                run_dir.check_new(where, cfg.fresh)
            except run_dir.RunDirError as e:
                raise ConfigError(f"{e} ({place_of('output_dir', provenance)})") from None
        found = resumes.get(where)
        p.config = p.config.model_copy(update={"run_id": found.run if found is not None and found.run else new})


def check_seq_len(processes: list[Process], provenance: dict[str, str]) -> None:
    """--dry-run: seq_len leaves room for a reply after the environments' prompts (orchestrator/prompt_fit.py)."""
    from composer_prime.env_runtime.errors import EnvError
    from composer_prime.orchestrator.prompt_fit import check_seq_len as fits, dry_run_inputs

    orch = next(p.config for p in processes if p.entrypoint == "orchestrator")  # islands share envs and seq_len
    try:
        fits(*dry_run_inputs(orch.envs, orch.model), orch.seq_len, place_of("seq_len", provenance))
    except EnvError as e:
        raise ConfigError(str(e)) from None


def resolve(argv: list[str]) -> tuple[RLConfig, list[Process], dict[str, Path], bool]:
    """Everything that can be wrong before a process starts, as one line and exit code 2."""
    with one_line_errors():
        cfg, provenance, dry_run = load(RLConfig, argv)
        cfg.split(provenance)  # every section's mistakes first, before what is true of this machine
        check(cfg, checks.RUN, provenance)
        run = Path(cfg.output_dir)
        resumes, resume_of = run_dirs(cfg, provenance)
        if cfg.diloco is not None:
            layers = decoder_layers(cfg.model)  # the trainer would find out after loading it, a minute in
            if layers is not None and cfg.diloco.fragments > layers:
                raise ConfigError(f"diloco.fragments: {cfg.diloco.fragments} is more than the model's {layers} decoder "
                                  f"layers ({place_of('diloco.fragments', provenance)})")
            if not dry_run:
                check(cfg, checks.ISLAND, provenance)
            processes = plan_islands(cfg, provenance, resume_of if cfg.resume else None)
        else:
            processes = plan(cfg, provenance, resume_of(run) if cfg.resume else None)
        own_runs(cfg, processes, resumes, provenance)  # before anything slow: whose directory this is
        for p in processes:
            if "cpus" in type(p.config).model_fields:
                check(p.config, {"cpus": checks.PROCESS["cpus"]}, provenance, prefix=f"{p.entrypoint}.")
            if p.entrypoint == "inference":
                check(p.config, {"engine": checks.check_engine}, provenance, prefix="inference.")
            if p.entrypoint == "orchestrator":
                check(p.config, {"volunteers": checks.check_toploc}, provenance, prefix="orchestrator.")
            if not dry_run and hasattr(p.config, "binds"):
                check_binds(p.config.binds(), provenance, prefix=f"{p.name}.")
        # every environment installed, its args valid: what the orchestrator would find at start (at a
        # real start only the cheap kinds: a verifiers import takes seconds, the orchestrator's own start says it)
        from composer_prime.env_runtime.envs import CHEAP, check_envs
        from composer_prime.env_runtime.errors import EnvError

        try:
            for orchestrator in [p.config for p in processes if p.entrypoint == "orchestrator"]:  # one per island
                check_envs(orchestrator, *(() if dry_run else (CHEAP,)))
        except EnvError as e:
            raise ConfigError(f"{e} ({place_of('orchestrator.envs', provenance)})") from None
        if dry_run:  # the environments' prompts are loaded here anyway; a real start's orchestrator checks them too
            check_seq_len(processes, provenance)
        paths = {p.name: run / "configs" / f"{p.name}.toml" for p in processes}
        try:
            for p in processes:
                write_toml(p.config, paths[p.name])
        except OSError as e:
            raise ConfigError(f"output_dir: cannot write {e.filename or run}: {e.strerror} "
                              f"({place_of('output_dir', provenance)})") from None
    return cfg, processes, paths, dry_run


def make_keys(processes: list[Process]) -> None:
    """Create the key files the plan names (only those missing): at launch, never for --dry-run."""
    for p in processes:
        if getattr(p.config, "auth", None) is not None and p.config.auth.keys_dir is not None:
            auth.make_keys(p.config.auth.keys_dir)
        if p.name == "trainer" and p.config.weight_broadcast.type == "shardcast":
            auth.ensure_signing_key(p.config.signing_key())


def main(argv: list[str] | None = None) -> None:
    setup("rl")
    # the processes' environment, this one's too, before anything here imports numpy or torch (the config's plug-ins
    # do): OpenBLAS starts a thread per core at load unless OMP_NUM_THREADS says 1, and a process running a second
    # thread is not forked (utils/prefork.py), so the first child, inference, was exec'd and imported it all again
    os.environ.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                       "TOKENIZERS_PARALLELISM": "false"})
    cfg, processes, paths, dry_run = resolve(sys.argv[1:] if argv is None else argv)
    run = Path(cfg.output_dir)
    if dry_run:
        print(f"resolved configs written to {run / 'configs'}")
        return
    finish = {p.name for p in processes if p.name.rpartition("-")[2] in ("orchestrator", "trainer")}
    wheres = sorted({Path(p.config.output_dir) for p in processes if p.name in finish})  # one per island
    for where in wheres if cfg.fresh else []:
        if gone := run_dir.clear(where):
            log.info(f"--fresh: deleted {where}'s {', '.join(gone)}")
    make_keys(processes)
    resolve_model(cfg.model)  # build once, before the processes race
    prefork.preload(f"composer_prime.entrypoints.{e}" for e in sorted({p.entrypoint for p in processes}))
    env = dict(os.environ)
    start = time.time()
    w = cfg.watchdog
    watch = Watch(run / "logs" / "watch", w.factor, w.floor_s, w.startup_s, w.first_batch_s, finish)
    ids = {Path(p.config.output_dir): p.config.run_id for p in processes if p.entrypoint == "trainer"}
    for where in wheres:  # the report covers every segment of the run: this one is recorded from here
        found = run_dir.checkpoints(where) if cfg.resume else []  # none: a new run, or a resume from step 0
        times = [r["time"] for job in ("trainer", "orchestrator") for r in metrics_rows(where / job / "metrics.jsonl")]
        report_segments.begin(where, found[-1][0] if found else None, ids.get(where), times, start)
    try:
        supervise({p.name: [sys.executable, "-m", f"composer_prime.entrypoints.{p.entrypoint}", "@", str(paths[p.name])]
                   for p in processes}, run / "logs", finish, env, watch, w.on_stall == "wait")  # each named by PROCESS_ENV, forked
    finally:
        for where in wheres:
            report_segments.end(where)
    for where in wheres:
        s = write_report(where, time.time() - start)
        log.info(f"done in {s['wall_s']:.0f}s{resumed_words(s['segments'])}: {s['steps']} steps, held-out reward "
                 f"{s['heldout_reward_start']:.3f} -> {s['heldout_reward_end']:.3f}"
                 + (f"; {s['volunteers']}" if s["volunteers"] else "") + f"; report {where / 'report.md'}")


if __name__ == "__main__":
    run_main(main)
