"""`uv run rl @ config.toml`: resolve one config, start inference, trainer and orchestrator (and relays).

Writes each process's resolved config to <output_dir>/configs/ (each runs alone from it, e.g.
on another machine), tees their logs to <output_dir>/logs/, and stops all of them, whole process
groups, if any of them fails or on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from composer_prime.config import ConfigError, RLConfig, write_toml
from composer_prime.config.loader import parse_argv, validate
from composer_prime.config.plan import Process, plan
from composer_prime.env_runtime.tasksets import EnvError, check_envs
from composer_prime.model.resolve import resolve_model
from composer_prime.trainer import checkpoint
from composer_prime.transports import auth
from composer_prime.transports.weights import filesystem
from composer_prime.utils.proc import die_with_parent
from composer_prime.utils.report import write_report


def resolve(argv: list[str]) -> tuple[RLConfig, dict[str, str], bool]:
    try:
        tree, provenance, dry_run = parse_argv(argv)
        return validate(RLConfig, tree, provenance), provenance, dry_run
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _pump(name: str, proc: subprocess.Popen, log_path: Path) -> None:
    with log_path.open("a") as log:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.write(line)
            log.flush()
            if not line.startswith(f"[{name}]"):
                line = f"[{name}] {line}"
            sys.stdout.write(line)
            sys.stdout.flush()


def stop(procs: dict[str, subprocess.Popen], grace_s: float = 45.0) -> None:  # > the vLLM engine's own 30 s shutdown
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def make_keys(processes: list[Process]) -> None:
    """Create the key files the plan names (only those missing): at launch, never for --dry-run."""
    for p in processes:
        if getattr(p.config, "auth", None) is not None and p.config.auth.keys_dir is not None:
            auth.make_keys(p.config.auth.keys_dir)
        if p.name == "trainer" and p.config.weight_broadcast.type == "shardcast":
            auth.ensure_signing_key(p.config.signing_key())


def main(argv: list[str] | None = None) -> None:
    cfg, provenance, dry_run = resolve(sys.argv[1:] if argv is None else argv)
    run = Path(cfg.output_dir)
    resume_from = None
    if cfg.resume and (found := checkpoint.latest(run / "checkpoints")):
        weights = filesystem.step_dir(run / "weights", found[0])
        if (weights / filesystem.MARKER).exists():
            resume_from = (found[0], weights)
    try:
        processes = plan(cfg, provenance, resume_from)
        if dry_run:  # every environment installed, its args valid: what the orchestrator would find at start
            check_envs(next(p.config for p in processes if p.name == "orchestrator"))
    except (ConfigError, EnvError) as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    paths = {}
    for p in processes:
        paths[p.name] = run / "configs" / f"{p.name}.toml"
        write_toml(p.config, paths[p.name])
    if dry_run:
        print(f"resolved configs written to {run / 'configs'}")
        return
    make_keys(processes)
    resolve_model(cfg.model, lambda m: print(f"[rl] {m}", flush=True))  # build once, before the processes race
    (run / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "TOKENIZERS_PARALLELISM": "false"}
    procs: dict[str, subprocess.Popen] = {}
    start = time.time()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for p in processes:
            procs[p.name] = subprocess.Popen(
                [sys.executable, "-m", f"composer_prime.entrypoints.{p.entrypoint}", "@", str(paths[p.name])],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                preexec_fn=die_with_parent())
            threading.Thread(target=_pump, args=(p.name, procs[p.name], run / "logs" / f"{p.name}.log"), daemon=True).start()
        while True:
            time.sleep(0.5)
            failed = [n for n, p in procs.items() if p.poll() not in (None, 0)]
            if failed:
                print(f"[rl] {failed[0]} exited with code {procs[failed[0]].returncode}; stopping the others "
                      f"(log: {run / 'logs' / (failed[0] + '.log')})", flush=True)
                stop(procs)
                raise SystemExit(1)
            if procs["orchestrator"].poll() == 0 and procs["trainer"].poll() == 0:
                break
            servers = [n for n in procs if n not in ("orchestrator", "trainer") and procs[n].poll() == 0]
            if servers:  # inference and relays serve until stopped
                print(f"[rl] {servers[0]} exited unexpectedly; stopping", flush=True)
                stop(procs)
                raise SystemExit(1)
    except KeyboardInterrupt:
        print("[rl] interrupted; stopping all processes", flush=True)
        stop(procs)
        raise SystemExit(130) from None
    stop(procs)
    s = write_report(run, time.time() - start)
    print(f"[rl] done in {s['wall_s']:.0f}s: {s['steps']} steps, held-out reward "
          f"{s['heldout_reward_start']:.3f} -> {s['heldout_reward_end']:.3f}; report {run / 'report.md'}", flush=True)


if __name__ == "__main__":
    main()
