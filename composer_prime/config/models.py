"""Pydantic configs, one per process (`RLConfig`, the config of `rl`, is in config/rl.py; what they nest of
the links between processes in config/links.py, the environments in config/envs.py).

Every model forbids unknown keys, so a typo is an error, not a silently ignored setting. Every
field carries `Field(description=...)` and, where a number has a sensible range, its bounds:
`--help` is generated from them (config/help.py) and an out-of-range value is a config error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from composer_prime.config.base import FieldError, Pinned, Port, Sections, Shared, Strict
from composer_prime.config.diloco import DiLoCoConfig
from composer_prime.config.envs import EnvConfig, EvalConfig
from composer_prime.config.links import AuthConfig, BatchTransportConfig, WeightBroadcastConfig
from composer_prime.config.nodes import NodesConfig
from composer_prime.config.sampling import RolloutSampling
from composer_prime.config.volunteers import VolunteersConfig


class WandbConfig(Strict):
    """Weights & Biases: metrics also go to W&B (utils/metrics.py); needs `uv sync --extra wandb`."""

    mode: Literal["disabled", "online", "offline"] = Field("disabled", description="disabled, online, or offline "
                                                                                   "(a local run directory)")
    project: str = Field("composer-prime", description="W&B project")
    entity: str | None = Field(None, description="W&B entity (team or user)")
    name: str | None = Field(None, description="each process logs its own run, <name>-trainer and "
                                               "<name>-orchestrator, grouped by name")
    dir: Path | None = Field(None, description="where W&B keeps its local files (offline runs); default the "
                                               "process's output_dir")

    @model_validator(mode="after")
    def _check(self) -> "WandbConfig":
        if self.mode != "disabled" and importlib.util.find_spec("wandb") is None:
            raise FieldError("mode", f"\"{self.mode}\" needs the wandb package: uv sync --extra wandb")
        return self


# ---------------------------------------------------------------- inference
class InferenceConfig(Shared, Pinned):
    """`uv run inference`: the generation server (an engine behind our HTTP routes)."""

    host: str = Field("127.0.0.1", description="listening address")
    port: Port = Field(8000, description="listening port (vLLM's own server takes port + 1000)")
    engine: Literal["auto", "hf", "vllm"] = Field("auto", description="auto: vllm when importable, else hf")
    max_model_len: int = Field(512, ge=2, description="longest sequence the engine accepts, in tokens")
    vllm_args: list[str] = Field(default_factory=list, description="extra arguments for vLLM's server")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="embedded engine (hf): where the model runs "
                                                                      "(auto: cuda when torch sees a GPU)")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="embedded engine: the weights' dtype "
                                                                              "(auto: bfloat16 on cuda, float32 on cpu)")
    graphs: Literal["auto", "off", "capture", "compile"] = Field(
        "auto", description="embedded engine: the decode step as recorded CUDA graphs (capture), compiled by "
                            "torch.compile first (compile; on cpu compiled only), or op by op (off); auto: capture "
                            "on cuda, off on cpu")
    max_batch: int | None = Field(None, ge=1, description="embedded engine: requests decoded at once, each holding "
                                                          "max_model_len tokens of KV cache (None: 256 on cuda, 64 on cpu)")
    weights_path: Path | None = Field(None, description="start from this step directory (set by rl on resume)")
    weight_version: int = Field(0, ge=0, description="the step of the weights served first (set by rl on resume)")
    weight_broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)

    @model_validator(mode="after")
    def _check(self) -> "InferenceConfig":
        if any(a.split("=")[0] in ("--host", "--port") for a in self.vllm_args):
            raise FieldError("vllm_args", "--host and --port are set by composer-prime (vLLM's server listens on "
                             "loopback behind ours); set inference.host and inference.port instead")
        wb = self.weight_broadcast
        if wb.type == "shardcast" and not (wb.servers and wb.public_key):
            raise FieldError("weight_broadcast", "shardcast needs `servers` and the trainer's `public_key`")
        if self.device == "cpu" and self.graphs == "capture":
            raise FieldError("graphs", "capture records CUDA graphs: it needs device = cuda or auto")
        if self.resolved_engine() == "vllm" and self.port + 1000 > 65535:
            raise FieldError("port", f"{self.port} + 1000 (vLLM's server) is above 65535")
        return self

    def resolved_engine(self) -> Literal["hf", "vllm"]:
        if self.engine != "auto":
            return self.engine
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"

    def binds(self) -> list[tuple[str, str, int]]:
        """(key, host, port) for every port this process listens on."""
        out = [("port", self.host, self.port)]
        if self.resolved_engine() == "vllm":  # vLLM's own server, behind ours
            out.append(("port + 1000 (vLLM's server)", "127.0.0.1", self.port + 1000))
        return out


# ---------------------------------------------------------------- orchestrator
BATCH_STEPS = "composer_prime.batch_steps"  # the entry-point group batch steps register in (orchestrator/batch.py)


class OrchestratorConfig(Shared, Pinned, Sections):
    """`uv run orchestrator`: sample tasks, collect and score rollouts, send batches to the trainer.
    Besides the fields below, one section per batch step (`orchestrator.distill`, ...), declared
    by the step's own module (orchestrator/batch.py)."""

    model_config = ConfigDict(extra="allow")  # the batch steps' sections, checked below
    GROUP: ClassVar[str] = BATCH_STEPS
    KIND: ClassVar[str] = "batch step"

    inference_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"], min_length=1,
                                      description="inference servers; requests are spread over all of them")
    inference_timeout_s: float = Field(300.0, gt=0, description="a request to an inference server unanswered this long fails "
                                                               "(a generation, a score, an audit)")
    envs: list[EnvConfig] = Field(default_factory=lambda: [EnvConfig()], min_length=1,
                                  description="the environment mix (each id once)")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sampling: RolloutSampling = Field(default_factory=RolloutSampling)
    batch_size: int = Field(64, ge=1, description="rollouts per trainer step (after dynamic sampling)")
    group_size: int = Field(8, ge=1, description="completions per task")
    advantage: Literal["drgrpo", "grpo"] = Field("drgrpo", description="Dr.GRPO (mean-centred) or GRPO (also "
                                                                       "divided by the group's std)")
    overlong_max: int = Field(0, ge=0, description="DAPO overlong shaping L_max in tokens; 0 = off")
    overlong_cache: int = Field(4, ge=1, description="DAPO L_cache: the soft band below L_max")
    length_penalty: float = Field(0.0, ge=0, description="reward -= length_penalty * completion_tokens / "
                                                         "sampling.max_tokens")
    dynamic_sampling: bool = Field(True, description="drop groups whose rewards are all equal, refill the batch")
    max_async_level: int = Field(1, ge=0, description="a batch for step n may use policy n-k at the oldest "
                                                      "(0 = strictly on-policy)")
    max_concurrency: int = Field(32, ge=1, description="episodes in flight at once")
    record_traces: bool = Field(False, description="append every rollout to <output_dir>/orchestrator/traces.jsonl "
                                                   "(OpenAI chat format: `composer-prime traces ingest` reads it)")
    island: int = Field(0, ge=0, description="DiLoCo: this orchestrator's island; it trains on every `islands`-th "
                                             "train task from this one on, disjoint from the other islands'")
    islands: int = Field(1, ge=1, description="DiLoCo: islands in the run (1: no islands)")
    run_id: str | None = Field(None, description="the run it belongs to, named in <output_dir>/orchestrator/checkpoint.json "
                                                 "(set by rl; utils/run_dir.py)")
    volunteers: VolunteersConfig = Field(default_factory=VolunteersConfig)
    transport: BatchTransportConfig = Field(default_factory=BatchTransportConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)

    @model_validator(mode="after")
    def _check(self) -> "OrchestratorConfig":
        self._load_sections()
        if self.island >= self.islands:
            raise FieldError("island", f"{self.island} is not below islands = {self.islands}")
        if len({e.id for e in self.envs}) != len(self.envs):
            raise FieldError("envs", "each environment id may appear once")
        self.groups_per_step()  # raises if the batch does not split into whole groups
        return self

    def step_classes(self) -> dict[str, type]:
        return self._classes

    def binds(self) -> list[tuple[str, str, int]]:
        """(key, host, port) for every port this process listens on: the volunteer pool's, if any."""
        return [("volunteers.port", self.volunteers.host, self.volunteers.port)] if self.volunteers.enabled else []

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
    """AdamW with linear warm-up, an optional linear decay and gradient clipping (model/optim.py)."""

    lr: float = Field(1e-4, gt=0, description="peak learning rate")
    warmup_steps: int = Field(10, ge=0, description="linear warm-up: Adam's first steps are sign-like and move a "
                                                    "small model a lot")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.99), description="AdamW betas")
    max_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    decay: Literal["constant", "linear"] = Field("constant", description="after warm-up: constant, or linear "
                                                                         "decay by 1 - step / max_steps")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="linear decay: the lr never falls below this share of lr")


LOSS_CHANNELS = "composer_prime.loss_channels"  # the entry-point group loss channels register in


class LossConfig(Sections):
    """The trainer's objective: a weight per channel, and each channel's own section
    (`trainer.loss.<channel>`), validated by the `Config` that the channel's module declares."""

    GROUP: ClassVar[str] = LOSS_CHANNELS
    KIND: ClassVar[str] = "loss channel"
    weights: dict[str, float] = Field(default_factory=lambda: {"rl": 1.0, "ce": 1.0},
                                      description="scale per loss channel (1 for a channel present in a batch but unset here)")

    @model_validator(mode="after")
    def _sections(self) -> "LossConfig":
        self._load_sections(self.weights, "weights")
        return self

    def channel_classes(self) -> dict[str, type]:
        return self._classes


class CheckpointConfig(Strict):
    """Trainer checkpoints (model, optimizer, step) under <output_dir>/checkpoints/."""

    interval: int = Field(10, ge=1, description="steps between trainer checkpoints (and one after the last step); "
                                                "a crashed run resumes from the newest and redoes the steps after it")
    keep_last: int = Field(2, ge=1, description="checkpoints kept; older ones are pruned")


class TrainerConfig(Shared, Pinned):
    """`uv run trainer`: FSDP2 training under torchrun; receives batches, publishes weights."""

    nproc: int = Field(1, ge=1, description="data-parallel FSDP2 ranks on each node (torchrun --nproc-per-node)")
    nodes: NodesConfig = Field(default_factory=NodesConfig, description="the machines this trainer spans (config/nodes.py)")
    dp_replicate: int = Field(1, ge=1, description="of the ranks, replica groups each holding one full sharded copy "
                                                   "(HSDP; trainer/parallel.py); must divide nproc * nodes.count")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on GPU, gloo on CPU")
    micro_batch_tokens: int = Field(4096, ge=1, description="tokens per micro-batch (padded), the unit of one "
                                                            "forward/backward")
    share_prefix: bool = Field(True, description="samples sharing a prefix (a group's prompt) run it once, in one "
                                                 "row under a 4-D mask; same logits, fewer tokens (sdpa/eager attention)")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="dtype of the forward and backward (auto: bfloat16 on CUDA, float32 on CPU); the weights "
                            "and AdamW's state stay float32 whatever it is")
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    ckpt: CheckpointConfig = Field(default_factory=CheckpointConfig)
    transport: BatchTransportConfig = Field(default_factory=BatchTransportConfig)
    weight_broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig)
    inference_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"],
                                      description="inference servers told to load each new step (filesystem)")
    resume: bool = Field(False, description="continue from the newest checkpoint in output_dir")
    run_id: str | None = Field(None, description="the run it belongs to, named in each checkpoint and weight step (set "
                                                 "by rl; None: a new id, or on resume its checkpoint's; utils/run_dir.py)")
    auth: AuthConfig = Field(default_factory=AuthConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    diloco: DiLoCoConfig | None = Field(None, description="this trainer is one island of a DiLoCo run "
                                                          "(config/diloco.py); None: it trains alone")

    @model_validator(mode="after")
    def _check(self) -> "TrainerConfig":
        if self.world_size() % self.dp_replicate:
            raise FieldError("dp_replicate", f"{self.dp_replicate} does not divide the {self.world_size()} ranks "
                                             f"(nproc {self.nproc} x nodes.count {self.nodes.count})")
        return self

    def world_size(self) -> int:
        return self.nproc * self.nodes.count

    def signing_key(self) -> Path:
        """The SHARDCAST signing key: as configured, else in the keys directory, else <output_dir>/keys."""
        from composer_prime.transports.auth import SIGNING_KEY

        return self.weight_broadcast.key_path or Path(self.auth.keys_dir or Path(self.output_dir) / "keys") / SIGNING_KEY

    def binds(self) -> list[tuple[str, str, int]]:
        """(key, host, port) for every port this process listens on: node 0's (the others only connect)."""
        if self.nodes.rank > 0:
            return []
        out = [("transport.address", *self.transport.endpoint())]
        if self.nodes.count > 1:
            out.append(("nodes.master", *self.nodes.address()))
        if self.weight_broadcast.type == "shardcast":
            out.append(("weight_broadcast.port", self.weight_broadcast.host, self.weight_broadcast.port))
        return out


# ---------------------------------------------------------------- sft
class SFTConfig(Strict):
    """`uv run sft`: answer-only cross-entropy on a JSONL of chat examples, or DPO on a pairs dataset."""

    model: str = Field("tiny", description=Shared.model_fields["model"].description)
    data: Path = Field(description='ce: JSONL, one {"messages": [..., {"role": "assistant", "content": ...}]} per line; '
                                   "dpo: a dataset directory from `composer-prime traces dataset`")
    objective: Literal["ce", "dpo"] = Field("ce", description="ce: likelihood of the last assistant message; dpo: "
                                                              "preference pairs with their reference log-probs")
    beta: float = Field(0.1, gt=0, description="dpo's beta")
    output_dir: Path = Field(Path("outputs/sft"), description="where the fine-tuned model directory is written")
    max_steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(16, ge=1, description="examples per step")
    lr: float = Field(1e-4, gt=0, description="peak learning rate")
    warmup_steps: int = Field(10, ge=0, description="linear warm-up steps")
    seed: int = Field(0, ge=0, description="seeds example order and the model's initialisation")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description=TrainerConfig.model_fields["compute_dtype"].description)
    micro_batch_tokens: int = Field(4096, ge=1, description=TrainerConfig.model_fields["micro_batch_tokens"].description)
