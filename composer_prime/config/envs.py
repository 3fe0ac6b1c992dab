"""The orchestrator's environments: one `EnvConfig` per environment of the mix (a verifiers v1 package
or an OpenEnv server) and the held-out evaluation's `EvalConfig`. Split from config/models.py, whose
`OrchestratorConfig` nests them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from composer_prime.config.base import FieldError, Strict


class EnvConfig(Strict):
    """One environment of the mix: a verifiers v1 package, or an OpenEnv server (env_runtime/envs.py)."""

    id: str = Field("reverse-text", min_length=1, description="the installed environment's id (openenv without a "
                                                              "url: the package whose server.app the orchestrator serves)")
    kind: Literal["verifiers", "openenv"] = Field("verifiers", description="verifiers: a verifiers v1 package, run "
                                                  "in-process; openenv: an OpenEnv server, driven over its /ws route")
    url: str | None = Field(None, pattern=r"^https?://", description="openenv: a running server's URL (none: the "
                                                                     "orchestrator starts the package on loopback)")
    servers: int = Field(1, ge=1, description="openenv without a url: servers the orchestrator starts")
    sessions: int = Field(1, ge=1, description="openenv: sessions each server accepts at once (its "
                                               "max_concurrent_envs); more episodes wait for one")
    step_timeout_s: float = Field(60.0, gt=0, description="openenv: a reset or step unanswered this long drops "
                                                          "the rollout")
    call_timeout_s: float = Field(300.0, gt=0, description="verifiers: a call into the environment (scoring: "
                                                           "the task's rewards and metrics; a tool call, opening "
                                                           "or closing its tool session) unreturned this long is cut "
                                                           "and its rollout dropped (dropped/timeout)")
    args: dict = Field(default_factory=dict, description="taskset config for training tasks (openenv: reset "
                                                         "arguments, and num_tasks: the seeds drawn)")
    eval_args: dict = Field(default_factory=lambda: {"split": "eval", "num_tasks": 200},
                            description="taskset config for held-out tasks (openenv: as args)")
    ratio: float = Field(1.0, gt=0, description="share of each batch's rollouts (normalised over envs)")
    group_size: int | None = Field(None, ge=1, description="completions per task; None = the orchestrator's "
                                                           "group_size")
    max_turns: int = Field(8, ge=1, description="model turns per episode for environments with tools")

    @model_validator(mode="after")
    def _check_kind(self) -> "EnvConfig":
        if self.kind != "openenv":
            for key, default in (("url", None), ("servers", 1), ("sessions", 1), ("step_timeout_s", 60.0)):
                if getattr(self, key) != default:
                    raise FieldError(key, "is for environments of kind = \"openenv\"")
        elif self.call_timeout_s != 300.0:
            raise FieldError("call_timeout_s", "is for environments of kind = \"verifiers\" (openenv: step_timeout_s)")
        elif self.url is not None and self.servers != 1:
            raise FieldError("servers", "is for servers the orchestrator starts; with a url there is one")
        return self


class EvalConfig(Strict):
    """Held-out evaluation."""

    interval: int = Field(5, ge=1, description="held-out eval every N steps (and at the first and last step)")
    num_tasks: int = Field(64, ge=1, description="held-out tasks per environment")
