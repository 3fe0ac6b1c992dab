"""Pydantic configs, one per process, plus `RLConfig`, which fills shared keys into all three.

Every model forbids unknown keys, so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Iterable, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from composer_prime.utils import plugins



# A list given as "a,b" on the command line or as a TOML array.
CommaList = Annotated[list[str], BeforeValidator(lambda v: [x for x in v.split(",") if x] if isinstance(v, str) else v)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Shared(Strict):
    """Keys every process reads; `rl` fills them in from the top level."""

    model: str = "tiny"  # "tiny" (built offline), a local path, or any Hugging Face id
    seq_len: int = 512
    max_steps: int = 20
    output_dir: Path = Path("outputs/run")
    seed: int = 0


class Pinned(Strict):
    """Per process, never shared: `rl` passes each section's own value."""

    cpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)  # pin this process to these cores; [] = all


class BatchTransportConfig(Strict):
    address: str = "tcp://127.0.0.1:5557"  # the trainer binds, the orchestrator connects


class AuthConfig(Strict):
    """Keys of processes that listen beyond loopback (transports/auth.py says which file is whose)."""

    keys_dir: Path | None = None  # from `composer-prime keys make --out DIR`; `rl` uses <output_dir>/keys when needed


class WandbConfig(Strict):
    """Weights & Biases: metrics also go to W&B (utils/metrics.py); needs `uv sync --extra wandb`."""

    mode: Literal["disabled", "online", "offline"] = "disabled"
    project: str = "composer-prime"
    entity: str | None = None
    name: str | None = None  # each process logs its own run, <name>-trainer and <name>-orchestrator, grouped by name
    dir: Path | None = None  # where W&B keeps its local files (offline runs); default the process's output_dir

    @model_validator(mode="after")
    def _check(self) -> "WandbConfig":
        import importlib.util

        if self.mode != "disabled" and importlib.util.find_spec("wandb") is None:
            raise ValueError(f"mode \"{self.mode}\" needs the wandb package: uv sync --extra wandb")
        return self


class WeightBroadcastConfig(Strict):
    """How new weights reach inference. `filesystem`: a shared `weights/` directory and a POST to
    /update_weights. `shardcast`: the trainer runs a SHARDCAST origin; inference nodes download,
    verify and load each step themselves (through relays or straight from the origin)."""

    type: Literal["filesystem", "shardcast"] = "filesystem"
    keep_last: int = 3  # steps kept on disk (and listed by the origin); older ones are pruned
    # shardcast, trainer side (the origin)
    host: str = "127.0.0.1"
    port: int = 8100
    shard_size: int = 50_000_000  # bytes; SHARDCAST's default
    delta: bool = True  # also publish step N as a compressed XOR against step N-1 when that is smaller
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # dtype of the published weights (auto: as trained)
    key_path: Path | None = None  # ed25519 signing key; default <output_dir>/keys/trainer.ed25519
    # shardcast, inference side
    servers: CommaList = Field(default_factory=list)  # relays and/or the origin, e.g. ["http://relay:8200"]
    public_key: str = ""  # the trainer's ed25519 public key: hex, or the file holding it (keys/trainer.ed25519.pub)


class RelayConfig(Strict):
    """`uv run relay`: mirror SHARDCAST upstreams and re-serve them."""

    upstream: CommaList
    public_key: str  # hex, or the file holding it (keys/trainer.ed25519.pub)
    host: str = "127.0.0.1"
    port: int = 8200
    data_dir: Path = Path("outputs/relay")
    keep_last: int = 3
    poll_wait_s: float = 30.0


# ---------------------------------------------------------------- inference
class InferenceConfig(Shared, Pinned):
    host: str = "127.0.0.1"
    port: int = 8000
    engine: Literal["auto", "hf", "vllm"] = "auto"  # auto: vllm when importable, else hf
    max_model_len: int = 512
    vllm_args: list[str] = Field(default_factory=list)
    weights_path: Path | None = None  # start from this step directory (set on resume)
    weight_version: int = 0
    weight_broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)

    @model_validator(mode="after")
    def _check(self) -> "InferenceConfig":
        wb = self.weight_broadcast
        if wb.type == "shardcast" and not (wb.servers and wb.public_key):
            raise ValueError("weight_broadcast: shardcast needs `servers` and the trainer's `public_key`")
        if any(a.split("=")[0] in ("--host", "--port") for a in self.vllm_args):
            raise ValueError("vllm_args: --host and --port are set by composer-prime (vLLM's server listens on "
                             "loopback behind ours); set inference.host and inference.port instead")
        return self


# ---------------------------------------------------------------- orchestrator
class SamplingConfig(Strict):
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16


class EnvConfig(Strict):
    id: str = "reverse-text"
    args: dict = Field(default_factory=dict)  # taskset config for training tasks
    eval_args: dict = Field(default_factory=lambda: {"split": "eval", "num_tasks": 200})
    ratio: float = Field(1.0, gt=0)  # share of each batch's rollouts (normalised over envs)
    group_size: int | None = Field(None, ge=1)  # completions per task; None = the orchestrator's group_size
    max_turns: int = Field(8, ge=1)  # model turns per episode for environments with tools


class EvalConfig(Strict):
    interval: int = 5  # held-out eval every N steps (and at the first and last step)
    num_tasks: int = 64


class Sections(Strict):
    """A model whose extra keys are plug-ins' own sections: the plug-ins are the entry points of
    `GROUP` plus the "module:Class" refs in `plugins`; each section is validated by the `Config`
    its class declares (and defaults when absent). Any other extra key is an unknown key."""

    model_config = ConfigDict(extra="allow")
    GROUP: ClassVar[str]
    KIND: ClassVar[str]  # what a plug-in is called in errors
    _classes: dict[str, type] = PrivateAttr(default_factory=dict)
    plugins: list[str] = Field(default_factory=list)  # plug-ins outside the package, "module:Class"

    def _load_sections(self, named: Iterable[str] = ()) -> None:
        """Validate the sections; `named`: names used elsewhere in the model that must be plug-ins."""
        try:
            classes = plugins.load(self.GROUP, self.plugins)
        except ValueError as e:
            raise ValueError(f"plugins: {e}") from None
        extra = self.__pydantic_extra__
        for name in named:
            if name not in classes:
                raise ValueError(f"unknown {self.KIND} '{name}' (known: {', '.join(sorted(classes))})")
        errors = [InitErrorDetails(type="extra_forbidden", loc=(k,), input=v) for k, v in extra.items() if k not in classes]
        for name, cls in classes.items():
            try:
                extra[name] = cls.Config.model_validate(extra.get(name, {}))
            except ValidationError as e:  # re-raised with the plug-in's name in each location
                errors += [InitErrorDetails(type=x["type"], loc=(name, *x["loc"]), input=x["input"], ctx=x.get("ctx", {}))
                           for x in e.errors()]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        self._classes = classes

    def section(self, name: str) -> BaseModel:
        return self.__pydantic_extra__[name]


BATCH_STEPS = "composer_prime.batch_steps"  # the entry-point group batch steps register in (orchestrator/batch.py)


class OrchestratorConfig(Shared, Pinned, Sections):
    """Besides the fields below, one section per batch step (`orchestrator.distill`, ...),
    declared by the step's own module (orchestrator/batch.py)."""

    model_config = ConfigDict(extra="allow")  # the batch steps' sections, checked below
    GROUP: ClassVar[str] = BATCH_STEPS
    KIND: ClassVar[str] = "batch step"
    inference_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"])
    envs: list[EnvConfig] = Field(default_factory=lambda: [EnvConfig()], min_length=1)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    batch_size: int = 64  # rollouts per trainer step (after dynamic sampling)
    group_size: int = 8  # completions per task
    advantage: Literal["drgrpo", "grpo"] = "drgrpo"
    overlong_max: int = Field(0, ge=0)  # DAPO overlong shaping L_max in tokens; 0 = off
    overlong_cache: int = Field(4, ge=1)  # DAPO L_cache: the soft band below L_max
    length_penalty: float = 0.0  # reward -= length_penalty * completion_tokens / sampling.max_tokens
    dynamic_sampling: bool = True  # drop groups whose rewards are all equal, refill the batch
    max_async_level: int = 1  # a batch for step n may use policy n-k at the oldest
    max_concurrency: int = 32
    transport: BatchTransportConfig = Field(default_factory=BatchTransportConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)

    @model_validator(mode="after")
    def _check(self) -> "OrchestratorConfig":
        self._load_sections()
        if len({e.id for e in self.envs}) != len(self.envs):
            raise ValueError("envs: each environment id may appear once")
        self.groups_per_step()  # raises if the batch does not split into whole groups
        return self

    def step_classes(self) -> dict[str, type]:
        return self._classes

    def groups_per_step(self) -> dict[str, int]:
        """Groups of each environment in one batch: batch_size * ratio / group_size, exactly."""
        total = sum(e.ratio for e in self.envs)
        out = {}
        for e in self.envs:
            size = e.group_size or self.group_size
            rollouts = self.batch_size * e.ratio / total
            if abs(rollouts - round(rollouts)) > 1e-6 or round(rollouts) % size or round(rollouts) == 0:
                raise ValueError(f"env '{e.id}': batch_size {self.batch_size} x ratio {e.ratio / total:.3g} = "
                                 f"{rollouts:g} rollouts, not a positive multiple of its group size {size}")
            out[e.id] = round(rollouts) // size
        return out


# ---------------------------------------------------------------- trainer
class OptimConfig(Strict):
    lr: float = 1e-4
    warmup_steps: int = 10  # linear warm-up: Adam's first steps are sign-like and move a small model a lot
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    max_norm: float = 1.0


LOSS_CHANNELS = "composer_prime.loss_channels"  # the entry-point group loss channels register in


class LossConfig(Sections):
    """The trainer's objective: a weight per channel, and each channel's own section
    (`trainer.loss.<channel>`), validated by the `Config` that the channel's module declares."""

    GROUP: ClassVar[str] = LOSS_CHANNELS
    KIND: ClassVar[str] = "loss channel"
    weights: dict[str, float] = Field(default_factory=lambda: {"rl": 1.0, "ce": 1.0})  # scale per channel (1 if unset)

    @model_validator(mode="after")
    def _sections(self) -> "LossConfig":
        self._load_sections(self.weights)
        return self

    def channel_classes(self) -> dict[str, type]:
        return self._classes


class CheckpointConfig(Strict):
    interval: int = 1  # steps between trainer checkpoints
    keep_last: int = 2


class TrainerConfig(Shared, Pinned):
    nproc: int = 1  # data-parallel FSDP2 ranks (torchrun --nproc-per-node)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    micro_batch_tokens: int = 4096
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    ckpt: CheckpointConfig = Field(default_factory=CheckpointConfig)
    transport: BatchTransportConfig = Field(default_factory=BatchTransportConfig)
    weight_broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig)
    inference_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"])
    resume: bool = False
    auth: AuthConfig = Field(default_factory=AuthConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)

    def signing_key(self) -> Path:
        """The SHARDCAST signing key: as configured, else in the keys directory, else <output_dir>/keys."""
        from composer_prime.transports.auth import SIGNING_KEY

        return self.weight_broadcast.key_path or Path(self.auth.keys_dir or Path(self.output_dir) / "keys") / SIGNING_KEY


# ---------------------------------------------------------------- sft
class SFTConfig(Strict):
    """`uv run sft`: answer-only cross-entropy on a JSONL of chat examples."""

    model: str = "tiny"
    data: Path  # JSONL: {"messages": [..., {"role": "assistant", "content": ...}]}
    output_dir: Path = Path("outputs/sft")
    max_steps: int = Field(100, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = 1e-4
    warmup_steps: int = 10
    seed: int = 0


# ---------------------------------------------------------------- rl (all three)
SHARED_KEYS = ("model", "seq_len", "max_steps", "output_dir", "seed")


class RLConfig(Shared):
    resume: bool = False
    inference: dict = Field(default_factory=dict)
    orchestrator: dict = Field(default_factory=dict)
    trainer: dict = Field(default_factory=dict)
    transport: BatchTransportConfig = Field(default_factory=BatchTransportConfig)
    weight_broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    inference_replicas: int = Field(1, ge=1)  # inference servers on consecutive ports
    relays: int = Field(0, ge=0)  # local SHARDCAST relays between the origin and inference (shardcast only)

    def split(self, provenance: dict[str, str] | None = None) -> tuple[InferenceConfig, OrchestratorConfig, TrainerConfig]:
        """Fill shared keys into each process config; a different value set twice is a conflict."""
        from composer_prime.config.loader import ConfigError, validate

        provenance = provenance or {}
        out = []
        fields_set = self.model_fields_set
        for name, cls in (("inference", InferenceConfig), ("orchestrator", OrchestratorConfig), ("trainer", TrainerConfig)):
            section = dict(getattr(self, name))
            for key in SHARED_KEYS:
                top = getattr(self, key)
                if key in section and key in fields_set and section[key] != (str(top) if isinstance(top, Path) else top):
                    where = provenance.get(f"{name}.{key}", "defaults")
                    raise ConfigError(f"{name}.{key}: conflicts with top-level {key} = {top!r} ({where})")
                section.setdefault(key, str(top) if isinstance(top, Path) else top)
            section.setdefault("auth", self.auth.model_dump())
            if name != "inference":
                section.setdefault("transport", self.transport.model_dump())
                section.setdefault("wandb", self.wandb.model_dump())
            if name == "trainer":  # the trainer decides where a run resumes; the orchestrator follows it
                section.setdefault("resume", self.resume)
                section.setdefault("weight_broadcast", self.weight_broadcast.model_dump(exclude_unset=True))
            out.append((name, cls, section))
        inf = validate(InferenceConfig, out[0][2], provenance, ("inference",))
        url = f"http://{inf.host}:{inf.port}"
        orch_section, trainer_section = out[1][2], out[2][2]
        orch_section.setdefault("inference_urls", [url])
        trainer_section.setdefault("inference_urls", [url])
        orch = validate(OrchestratorConfig, orch_section, provenance, ("orchestrator",))
        trainer = validate(TrainerConfig, trainer_section, provenance, ("trainer",))
        for name, cls in trainer.loss.channel_classes().items():  # each channel's own checks against the orchestrator
            try:
                cls.check_run(trainer.loss.section(name), orch)
            except ValueError as e:
                raise ConfigError(f"trainer.loss.{name}.{e}") from None
        return inf, orch, trainer
