"""Load verifiers v1 Tasksets by id and score completions in-process (no harness process).

verifiers' `null` harness starts a Python program per rollout (seconds each on a small CPU);
the orchestrator instead generates through the token route itself and calls the Task's own
`@vf.reward` / `@vf.metric` methods on a Trace holding the reply.

Everything an environment's own code can raise while it is found, configured or loaded comes
out as one `EnvError` line naming the environment, the arguments and the message: the user
fixes an argument or installs a package, and a traceback would only hide which.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.utils.generic import concrete_type
from verifiers.v1.utils.loaders import taskset_class

from composer_prime.env_runtime.errors import EnvError  # noqa: F401 - also this module's name for it (its users import it here)

INSTALL_HINT = ("install its package with `uv pip install <directory, wheel or name>` from anywhere "
                "(e.g. `uv pip install -e environments/{name}`), "
                "or from the hub with `composer-prime env install owner/{name}`")


def _module(taskset_id: str) -> str:
    return taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _where(e: BaseException) -> str:
    """' (dir/file.py:line)' of the innermost frame that raised: the environment's own line, usually."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    path = Path(frames[-1].filename)
    return f" ({path.parent.name}/{path.name}:{frames[-1].lineno})"


def _describe(e: BaseException) -> str:
    message = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {message}{_where(e)}"


def _args_text(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items()) or "no args"


def taskset_class_of(taskset_id: str) -> type[vf.Taskset]:
    """The Taskset class an installed environment exports."""
    try:
        return taskset_class(taskset_id)
    except ModuleNotFoundError as e:
        missing = getattr(e.__cause__, "name", None) or ""
        if missing and missing.split(".")[0] != _module(taskset_id):  # the package is there; one of its imports is not
            raise EnvError(f"environment '{taskset_id}' imports '{missing}', which is not installed") from None
        hint = INSTALL_HINT.format(name=_module(taskset_id).replace("_", "-"))
        raise EnvError(f"environment '{taskset_id}' is not installed: {hint}") from None
    except Exception as e:  # noqa: BLE001 - the environment's own import-time code or packaging
        raise EnvError(f"environment '{taskset_id}' failed to import: {_describe(e)}") from None


def taskset_config(taskset_id: str, args: dict[str, Any]) -> tuple[type[vf.Taskset], vf.TasksetConfig]:
    """The Taskset class of an installed environment and its validated config; builds no task."""
    cls = taskset_class_of(taskset_id)
    config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    try:
        return cls, config_cls.model_validate({"id": taskset_id, **args})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'args'}: {x['msg']}" for x in e.errors())
        raise EnvError(f"environment '{taskset_id}': bad args: {problems}") from None
    except Exception as e:  # noqa: BLE001 - a validator of the environment's config raised something else
        raise EnvError(f"environment '{taskset_id}' ({_args_text(args)}): {_describe(e)}") from None


def load_tasks(taskset_id: str, args: dict[str, Any]) -> list[vf.Task]:
    cls, config = taskset_config(taskset_id, args)
    try:
        return list(cls(config))
    except Exception as e:  # noqa: BLE001 - missing data, an assertion on an argument: the user's to fix
        raise EnvError(f"environment '{taskset_id}' ({_args_text(args)}): {_describe(e)}") from None


def messages(task: vf.Task) -> list[dict]:
    data = task.data
    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out.extend(m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in data.prompt or [])
    return out


TRACED_KEPT = 8192  # tasks whose trace record is remembered (a task's key and hash hash its data as JSON)
_traced: dict[int, tuple[vf.Task, vf.TraceTask]] = {}  # id(task) -> (the task, kept alive so the id stays its own; its record)
_no_agent: list[vf.AgentInfo] = []  # the agent of every scored trace: none (it is the orchestrator's own turns)


def _trace_parts(task: vf.Task) -> tuple[vf.TraceTask, vf.AgentInfo]:
    """The trace's task record and agent, built once per task and once per process (85 of a score's
    290 us on the 2-core CPU, every rollout), each scored trace getting its own shallow copy."""
    if (hit := _traced.get(id(task))) is None or hit[0] is not task:
        if len(_traced) >= TRACED_KEPT:
            _traced.pop(next(iter(_traced)))
        hit = _traced[id(task)] = (task, vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash))
    if not _no_agent:
        _no_agent.append(vf.AgentInfo(config=vf.AgentConfig()))
    return hit[1].model_copy(), _no_agent[0].model_copy()


async def score(task: vf.Task, reply: str, runtime: Any = None) -> tuple[float, dict[str, float]]:
    """Run the task's rewards and metrics on its final reply; `runtime` is the rollout's tool
    session (multi-turn tasks), passed to rewards that take a `runtime` parameter."""
    traced, agent = _trace_parts(task)
    trace = vf.Trace(task=traced, agent=agent, root_reply=reply)
    await task.score(trace, runtime=runtime)
    return trace.reward, {k: v for k, v in trace.metrics.items() if v is not None}
