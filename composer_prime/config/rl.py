"""`RLConfig`: the one config `rl` reads, split into one validated config per process.

Top-level keys shared by every process (`model`, `seq_len`, `max_steps`, `output_dir`, `seed`)
are filled into each section; a section that sets one to another value is a conflict, since
processes that disagree on them cannot work together. `transport`, `weight_broadcast` and
`resume` are filled in where a section leaves them out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from composer_prime.config.help import Section
from composer_prime.config.base import FieldError, Shared, Strict
from composer_prime.config.diloco import DiLoCoConfig
from composer_prime.config.loader import ConfigError, alias, place_of, validate
from composer_prime.config.links import AuthConfig, BatchTransportConfig, WeightBroadcastConfig
from composer_prime.config.models import InferenceConfig, OrchestratorConfig, TrainerConfig, WandbConfig

SHARED_KEYS = ("model", "seq_len", "max_steps", "output_dir", "seed")


class WatchdogConfig(Strict):
    """`rl` watches progress (utils/watch.py) in phases, each with its limit: until every process is up
    (`startup_s`: a model's conversion, vLLM's start), then until the first steps (`first_batch_s`: a
    reward call, an environment's first episode), then steady (max(floor_s, factor x the slowest step so
    far)). Past the limit with no process advancing, it writes every process's stacks, names the one
    that stopped (or what it waits on) and stops the run."""

    factor: float = Field(10.0, gt=1, description="steady: stalled after this many times the slowest step so "
                                                  "far without progress")
    floor_s: float = Field(30.0, gt=0, description="steady: never stalled sooner than this (evaluations, checkpoints)")
    startup_s: float = Field(1800.0, gt=0, description="until every process is up: model conversion, vLLM's start")
    first_batch_s: float = Field(120.0, gt=0, description="once every process is up, until the first steps: "
                                                          "no rollout, step or weight load for this long")
    on_stall: Literal["stop", "wait"] = Field("stop", description="stop the run (resume it with --resume), or say "
                                                                  "so and keep waiting")


class RLConfig(Shared):
    """`uv run rl`: one config for inference, orchestrator and trainer (and relays), started together."""

    resume: bool = Field(False, description="continue every process from the newest checkpoint in output_dir")
    fresh: bool = Field(False, description="start over in an output_dir that holds another run: delete its checkpoints, "
                                           "weights, metrics and report first (keys, invites and logs stay)")
    inference_replicas: int = Field(1, ge=1, description="inference servers on consecutive ports")
    relays: int = Field(0, ge=0, description="local SHARDCAST relays between the origin and inference "
                                             "(shardcast only)")
    transport: BatchTransportConfig = Field(default_factory=BatchTransportConfig)
    weight_broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    diloco: DiLoCoConfig | None = Field(None, description="islands: whole inference + orchestrator + trainer groups "
                                                          "synced by Streaming DiLoCo (config/diloco.py, config/plan.py)")
    inference: Annotated[dict, Section(InferenceConfig, SHARED_KEYS)] = Field(default_factory=dict)
    orchestrator: Annotated[dict, Section(OrchestratorConfig, SHARED_KEYS)] = Field(default_factory=dict)
    trainer: Annotated[dict, Section(TrainerConfig, SHARED_KEYS)] = Field(default_factory=dict)

    def split(self, provenance: dict[str, str] | None = None
              ) -> tuple[InferenceConfig, OrchestratorConfig, TrainerConfig]:
        """Fill shared keys into each process config; a section that sets one differently is a conflict.
        A key filled in is recorded in `provenance` as set where its top-level key was."""
        provenance = {} if provenance is None else provenance
        sections = {}
        for name in ("inference", "orchestrator", "trainer"):
            section = dict(getattr(self, name))
            for key in SHARED_KEYS:
                top = getattr(self, key)
                top = str(top) if isinstance(top, Path) else top
                if key in section and section[key] != top:
                    where = place_of(f"{name}.{key}", provenance)
                    raise ConfigError(f"{name}.{key}: conflicts with top-level {key} = {top!r} ({where})")
                section[key] = top
            filled = {"auth": self.auth.model_dump()}
            if name != "inference":
                filled |= {"transport": self.transport.model_dump(), "wandb": self.wandb.model_dump()}
            if name == "trainer":  # the trainer decides where a run resumes; the orchestrator follows it
                filled |= {"resume": self.resume, "weight_broadcast": self.weight_broadcast.model_dump(exclude_unset=True)}
            for key, value in filled.items():
                section.setdefault(key, value)
            for key in (*SHARED_KEYS, *filled):
                if key not in getattr(self, name):
                    alias(provenance, key, f"{name}.{key}")
            sections[name] = section
        inf = validate(InferenceConfig, sections["inference"], provenance, ("inference",))
        for name in ("orchestrator", "trainer"):
            sections[name].setdefault("inference_urls", [f"http://{inf.host}:{inf.port}"])
        orch = validate(OrchestratorConfig, sections["orchestrator"], provenance, ("orchestrator",))
        trainer = validate(TrainerConfig, sections["trainer"], provenance, ("trainer",))
        for name, cls in trainer.loss.channel_classes().items():  # each channel's own checks against the orchestrator
            try:
                cls.check_run(trainer.loss.section(name), orch)
            except ValueError as e:
                key = f"trainer.loss.{name}" + (f".{e.key}" if isinstance(e, FieldError) else "")
                raise ConfigError(f"trainer.loss.{name}.{e} ({place_of(key, provenance)})") from None
        return inf, orch, trainer
