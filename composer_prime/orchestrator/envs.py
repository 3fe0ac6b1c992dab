"""Load verifiers v1 Tasksets by id and score completions in-process (no harness process).

verifiers' `null` harness starts a Python program per rollout (seconds each on a small CPU);
the orchestrator instead generates through the token route itself and calls the Task's own
`@vf.reward` / `@vf.metric` methods on a Trace holding the reply.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.utils.generic import concrete_type
from verifiers.v1.utils.loaders import taskset_class


def load_tasks(taskset_id: str, args: dict[str, Any]) -> list[vf.Task]:
    try:
        cls = taskset_class(taskset_id)
    except ModuleNotFoundError:
        raise SystemExit(f"environment '{taskset_id}' is not installed (uv pip install -e environments/{taskset_id})") from None
    config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    try:
        config = config_cls.model_validate({"id": taskset_id, **args})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'args'}: {x['msg']}" for x in e.errors())
        raise SystemExit(f"environment '{taskset_id}': bad args: {problems}") from None
    try:
        return list(cls(config))
    except (OSError, ValueError) as e:  # missing or malformed data: the user's to fix, not a traceback
        raise SystemExit(f"environment '{taskset_id}': {e}") from None


def messages(task: vf.Task) -> list[dict]:
    data = task.data
    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out.extend(m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in data.prompt or [])
    return out


async def score(task: vf.Task, reply: str, runtime: Any = None) -> tuple[float, dict[str, float]]:
    """Run the task's rewards and metrics on its final reply; `runtime` is the rollout's tool
    session (multi-turn tasks), passed to rewards that take a `runtime` parameter."""
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        root_reply=reply,
    )
    await task.score(trace, runtime=runtime)
    return trace.reward, {k: v for k, v in trace.metrics.items() if v is not None}
