"""Whether a run's prompts leave room for a completion within `seq_len` (issue 46).

A rollout whose prompt is `seq_len` tokens or longer samples nothing (rollouts.TokenTurns has no
budget), so a run whose every prompt is that long trains on empty batches to its end, reward 0,
and exits 0 (`rl @ configs/quickstart.toml --seq_len 8`). `rl --dry-run` and the orchestrator's
start measure each verifiers environment's training prompts with the model's tokenizer, rendered
as the first turn sees them but without tool schemas (a lower bound), and refuse such a seq_len in
one line. An OpenEnv environment's prompts come from its server at reset: not measured here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from composer_prime.config.envs import EnvConfig
from composer_prime.env_runtime.errors import EnvError

MEASURED = 4096  # train tasks measured per environment (the tiny tokenizer renders ~20k prompts a second)


def shortest_prompt(tasks: Sequence, tok: PreTrainedTokenizerBase, limit: int = MEASURED) -> int | None:
    """The fewest tokens of the first `limit` tasks' prompts; None where none is a verifiers task."""
    import verifiers.v1 as vf

    from composer_prime.env_runtime.tasksets import messages
    from composer_prime.utils.chat import prompt_ids

    lengths = [len(prompt_ids(tok, messages(t))) for t in list(tasks)[:limit] if isinstance(t, vf.Task)]
    return min(lengths) if lengths else None


def check_seq_len(envs: Iterable[tuple[str, Sequence]], tok: PreTrainedTokenizerBase | None, seq_len: int,
                  where: str) -> None:
    """EnvError naming the first environment (id, train tasks) whose every measured prompt leaves no token of
    `seq_len` for the model's reply; `where` says where seq_len was set (no tokenizer: nothing checked)."""
    for env_id, tasks in envs if tok is not None else []:
        shortest = shortest_prompt(tasks, tok)
        if shortest is not None and shortest >= seq_len:
            measured = f"its {len(tasks)}" if len(tasks) <= MEASURED else f"its first {MEASURED}"  # dry runs pass MEASURED + 1
            raise EnvError(f"seq_len: {seq_len} leaves no room for a completion: {env_id}'s shortest prompt is "
                           f"{shortest} tokens (of {measured} train tasks), so every rollout would sample nothing; "
                           f"give seq_len above {shortest} ({where})")


def model_on_disk(name: str) -> Path | None:
    """The model's directory where it is there already: "tiny" built, "smollm2-135m" converted, a directory.
    A dry run never builds or converts one (a CPU-minute) nor downloads one; None: not measured here."""
    from composer_prime.model.tiny import cache_root, recipe_hash

    found = {"tiny": cache_root() / "models" / f"tiny-{recipe_hash()}",
             "smollm2-135m": cache_root() / "models" / "smollm2-135m-instruct"}.get(name, Path(name).expanduser())
    try:
        return found if (found / "tokenizer.json").is_file() and (name not in ("tiny", "smollm2-135m")
                                                                  or (found / "READY").exists()) else None
    except OSError:  # another user's cache
        return None


def dry_run_inputs(envs: list[EnvConfig], model: str) -> tuple[list[tuple[str, list]], PreTrainedTokenizerBase | None]:
    """What `rl --dry-run` checks: each verifiers environment's first train tasks and the model's tokenizer,
    loaded without torch (AutoTokenizer imports it: 4 s more on every dry run). An environment that cannot
    build its tasks yet (a task set not built), or a model not on disk, is left to the orchestrator's start,
    which checks with what it loads anyway (tokenizer None: nothing to check here)."""
    from composer_prime.env_runtime.tasksets import taskset_config

    model_dir = model_on_disk(model)
    if model_dir is None:
        return [], None
    measured = []
    for env in envs:
        if env.kind != "verifiers":
            continue
        try:
            cls, config = taskset_config(env.id, env.args)
            measured.append((env.id, list(itertools.islice(iter(cls(config)), MEASURED + 1))))
        except Exception:  # noqa: BLE001 - the environment's own failure: the orchestrator's start reports it
            continue
    from transformers import PreTrainedTokenizerFast

    try:
        return measured, PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    except (OSError, ValueError):  # unreadable here, or not a fast tokenizer: the orchestrator's start checks
        return [], None
