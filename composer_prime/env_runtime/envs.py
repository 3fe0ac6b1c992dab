"""The kinds of environment a run mixes, and the one place that tells them apart.

An environment of the mix (`[[orchestrator.envs]]`) is a `verifiers` v1 package, loaded and
scored in-process (tasksets.py), or an `openenv` server, started here from its package or
reached at its URL (openenv.py). Whatever its kind, the orchestrator sees the same thing: its
training tasks and held-out tasks (each opens its own episodes, env_runtime/episode.py), a start
and a close, and counters of its own for the metrics. `--dry-run` runs each kind's cheap check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from composer_prime.config import OrchestratorConfig
from composer_prime.config.envs import EnvConfig
from composer_prime.env_runtime.calls import CallBox, code_of
from composer_prime.env_runtime.errors import EnvError


class Env(Protocol):
    """One environment of a run, as the orchestrator uses it."""

    train: Sequence  # tasks drawn for training (each has what env_runtime/episode.py opens an episode from)
    held_out: list  # the fixed held-out tasks
    box: CallBox | None  # where its own code (a verifiers reward) runs, under its call_timeout_s

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, float]: ...  # the environment's own counters (env/<id>/<name>)


@dataclass
class VerifiersEnv:
    train: list
    held_out: list
    box: CallBox | None = None
    counters: dict[str, float] = field(default_factory=dict)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return self.counters


def check_verifiers(env: EnvConfig, where: str) -> None:
    from composer_prime.env_runtime.tasksets import taskset_class_of, taskset_config  # verifiers: seconds to import

    try:
        taskset_class_of(env.id)
    except EnvError as e:
        raise EnvError(f"{where}: {e}") from None
    for key in ("args", "eval_args"):
        try:
            taskset_config(env.id, getattr(env, key))
        except EnvError as e:
            raise EnvError(f"{where}.{key}: {e}") from None


def check_env(env: EnvConfig, where: str) -> None:
    """Raise EnvError (naming `where`) unless `env` can run: cheap, nothing is built or started."""
    if env.kind == "openenv":
        from composer_prime.env_runtime import openenv  # aiohttp and the client: only for runs that have one

        openenv.check(env, where)
    else:
        check_verifiers(env, where)


CHEAP = ("openenv",)  # kinds whose check costs no heavy import: also checked when a run starts


def check_envs(cfg: OrchestratorConfig, kinds: tuple[str, ...] = ("verifiers", "openenv")) -> None:
    """The environments of the mix of these kinds checked: every kind at `rl --dry-run`, the
    cheap ones when `rl` and the orchestrator start (a verifiers package fails as it loads)."""
    for i, env in enumerate(cfg.envs):
        if env.kind in kinds:
            check_env(env, f"orchestrator.envs[{i}]")


def load_env(env: EnvConfig, eval_tasks: int, log_dir: Path) -> Env:
    """The environment with its tasks; its servers (if any) start with `start()`. `log_dir` gets the
    logs of servers started here."""
    if env.kind == "openenv":
        from composer_prime.env_runtime import openenv

        return openenv.OpenEnvEnv(env, eval_tasks, log_dir)
    from composer_prime.env_runtime.tasksets import load_tasks

    train, held_out = load_tasks(env.id, env.args), load_tasks(env.id, env.eval_args)[:eval_tasks]
    return VerifiersEnv(train, held_out, CallBox(env.id, env.call_timeout_s, code_of(train[:1] or held_out[:1])))
