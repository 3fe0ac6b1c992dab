"""`uv run rl @ config.toml`: resolve one config, start inference, trainer and orchestrator (and relays;
with `[diloco]`, one such group per island and a lighthouse).

Checks everything it can before starting anything (config, model, output directory, cores,
ports: one line and exit code 2), writes each process's resolved config to <output_dir>/configs/
(each runs alone from it, e.g. on another machine), then runs them under utils/supervise.py:
logs in <output_dir>/logs/, all stopped when one fails, the console ending with its own line.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from composer_prime.config import ConfigError, RLConfig, write_toml
from composer_prime.config.loader import check, check_binds, load, one_line_errors, place_of
from composer_prime.config.plan import Process, plan, plan_islands
from composer_prime.entrypoints import checks
from composer_prime.model.resolve import decoder_layers, resolve_model
from composer_prime.transports import auth
from composer_prime.utils.logs import setup
from composer_prime.utils.report import write_report
from composer_prime.utils.supervise import supervise
from composer_prime.utils.watchdog import Watch

log = logging.getLogger(__name__)


def resume_point(run: Path) -> tuple[int, Path] | None:
    """The newest step with both a checkpoint and its weights. Imported here: torch takes seconds to
    import, which every dry run and every bad command line would otherwise wait for."""
    from composer_prime.trainer import checkpoint
    from composer_prime.transports.weights import filesystem

    if found := checkpoint.latest(run / "checkpoints"):
        weights = filesystem.step_dir(run / "weights", found[0])
        if (weights / filesystem.MARKER).exists():
            return found[0], weights
    return None


def resolve(argv: list[str]) -> tuple[RLConfig, list[Process], dict[str, Path], bool]:
    """Everything that can be wrong before a process starts, as one line and exit code 2."""
    with one_line_errors():
        cfg, provenance, dry_run = load(RLConfig, argv)
        cfg.split(provenance)  # every section's mistakes first, before what is true of this machine
        check(cfg, checks.RUN, provenance)
        run = Path(cfg.output_dir)
        if cfg.diloco is not None:
            layers = decoder_layers(cfg.model)  # the trainer would find out after loading it, a minute in
            if layers is not None and cfg.diloco.fragments > layers:
                raise ConfigError(f"diloco.fragments: {cfg.diloco.fragments} is more than the model's {layers} decoder "
                                  f"layers ({place_of('diloco.fragments', provenance)})")
            if not dry_run:
                check(cfg, checks.ISLAND, provenance)
            processes = plan_islands(cfg, provenance, resume_point if cfg.resume else None)
        else:
            processes = plan(cfg, provenance, resume_point(run) if cfg.resume else None)
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
    cfg, processes, paths, dry_run = resolve(sys.argv[1:] if argv is None else argv)
    run = Path(cfg.output_dir)
    if dry_run:
        print(f"resolved configs written to {run / 'configs'}")
        return
    make_keys(processes)
    resolve_model(cfg.model)  # build once, before the processes race
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.time()
    finish = {p.name for p in processes if p.name.rpartition("-")[2] in ("orchestrator", "trainer")}
    w = cfg.watchdog
    watch = Watch(run / "logs" / "watch", w.factor, w.floor_s, w.startup_s)
    supervise({p.name: [sys.executable, "-m", f"composer_prime.entrypoints.{p.entrypoint}", "@", str(paths[p.name])]
               for p in processes}, run / "logs", finish, env, watch, w.on_stall == "wait")  # each named by PROCESS_ENV
    for where in sorted({Path(p.config.output_dir) for p in processes if p.name in finish}):  # one per island
        s = write_report(where, time.time() - start)
        log.info(f"done in {s['wall_s']:.0f}s: {s['steps']} steps, held-out reward "
                 f"{s['heldout_reward_start']:.3f} -> {s['heldout_reward_end']:.3f}"
                 + (f"; {s['volunteers']}" if s["volunteers"] else "") + f"; report {where / 'report.md'}")


if __name__ == "__main__":
    main()
