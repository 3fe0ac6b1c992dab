"""Scaffold a verifiers v1 environment package shaped like `environments/reverse-text`: a
hatchling pyproject, a package whose `__all__` exports one Taskset, a README and a test. The
example task (upper-case some words) is complete, so `composer-prime env validate` passes at once.

Unlike `vf-init` (which names the directory after the module, `my_env/`), the directory takes
the dash-case project name, as every environment in this repository does.
"""

from __future__ import annotations

import re
from pathlib import Path

from composer_prime.hub.errors import ToolError

NAME = re.compile(r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$")

PYPROJECT = """\
[project]
name = "{dash}"
version = "0.1.0"
description = "{dash}: <one-line description>."
requires-python = ">=3.11"
dependencies = ["verifiers==0.4.0"]

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["{pkg}"]
"""

INIT = """\
from .taskset import {cls}Taskset

__all__ = ["{cls}Taskset"]
"""

TASKSET = '''\
"""{dash}: repeat a few words in upper case (the scaffold's example; replace it with your task).

The reference reply lives in the TaskData `answer` field: `composer-prime env validate` scores
it as the reply (it must reach 1.0) and checks that an empty reply scores below it. `split`
"train" and "eval" are disjoint: `rl` trains on the first and reports held-out reward on the
second (it passes `split = "eval"` for the held-out set, see `orchestrator.envs[].eval_args`).
"""

from __future__ import annotations

import random
import zlib
from typing import Literal

import verifiers.v1 as vf

SYSTEM_PROMPT = "Repeat the words in upper case."
WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean"]


def word_accuracy(reply: str, answer: str) -> float:
    """Fraction of positions holding the right word, over the longer of the two replies."""
    got, want = reply.split(), answer.split()
    if not got or not want:
        return 0.0
    return sum(g == w for g, w in zip(got, want)) / max(len(got), len(want))


def split_of(prompt: str) -> str:
    """A prompt's split, fixed by its content: one in five is held out."""
    return "eval" if zlib.crc32(prompt.encode()) % 5 == 0 else "train"


class {cls}Data(vf.TaskData):
    answer: str


class {cls}Task(vf.Task[{cls}Data]):
    @vf.reward(weight=1.0)
    async def accuracy(self, trace: vf.Trace) -> float:
        return word_accuracy(trace.last_reply, self.data.answer)


class {cls}Config(vf.TasksetConfig):
    num_tasks: int = 100
    split: Literal["train", "eval"] = "train"
    seed: int = 0


class {cls}Taskset(vf.Taskset[{cls}Task, {cls}Config]):
    def load(self) -> list[{cls}Task]:
        rng = random.Random(self.config.seed)
        tasks = []
        while len(tasks) < self.config.num_tasks:
            words = rng.sample(WORDS, rng.randint(2, 4))
            prompt = " ".join(words)
            if split_of(prompt) != self.config.split:
                continue
            data = {cls}Data(id=f"{{len(tasks)}}", prompt=prompt, system_prompt=SYSTEM_PROMPT,
                            answer=" ".join(w.upper() for w in words))
            tasks.append({cls}Task(data, self.config.task))
        return tasks
'''

TEST = '''\
import asyncio

import verifiers.v1 as vf
from {pkg}.taskset import {cls}Config, {cls}Taskset, word_accuracy


def _score(task, reply: str) -> float:
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        root_reply=reply,
    )
    asyncio.run(task.score(trace))
    return trace.reward


def test_gold_scores_one_and_empty_scores_zero():
    task = list({cls}Taskset({cls}Config(num_tasks=1)))[0]
    assert _score(task, task.data.answer) == 1.0
    assert _score(task, "") == 0.0
    assert word_accuracy("APPLE x", "APPLE RIVER") == 0.5


def test_the_splits_are_disjoint():
    train, held_out = ({{t.data.prompt for t in {cls}Taskset({cls}Config(num_tasks=50, split=split))}}
                       for split in ("train", "eval"))
    assert train and held_out and not train & held_out
'''

README = """\
# {dash}

A verifiers v1 environment scaffolded by `composer-prime env init`.

- `{pkg}/taskset.py`: the Task (its `@vf.reward`), the TaskData (with the reference `answer`)
  and the Taskset (`load` builds the tasks).
- `tests/`: unit tests of the reward and the splits.

```bash
uv run composer-prime env validate {path}     # gold answer scores 1.0, an empty reply below it
uv pip install -e {path}                      # make it importable by id, then train on it:
uv run rl @ configs/quickstart.toml --orchestrator.envs '[{{id = "{dash}"}}]'
uv run composer-prime env build {path}        # wheel + source archive + content hash
uv run composer-prime env publish {path}      # dry run; --yes pushes to the hub
```
"""


def names(name: str) -> tuple[str, str, str]:
    """(dash-case project name, module name, class prefix)."""
    if not NAME.match(name):
        raise ToolError(f"invalid environment name {name!r}: use lowercase letters, digits and '-' (e.g. my-env)")
    dash = name.replace("_", "-")
    pkg = dash.replace("-", "_")
    return dash, pkg, "".join(part.capitalize() for part in pkg.split("_"))


def scaffold(name: str, parent: Path, force: bool = False) -> Path:
    dash, pkg, cls = names(name)
    root = parent / dash
    if root.exists() and not force:
        raise ToolError(f"{root} already exists (pass --force to overwrite)")
    files = {
        "pyproject.toml": PYPROJECT.format(dash=dash, pkg=pkg),
        "README.md": README.format(dash=dash, pkg=pkg, path=root),
        f"{pkg}/__init__.py": INIT.format(cls=cls),
        f"{pkg}/taskset.py": TASKSET.format(dash=dash, cls=cls),
        f"tests/test_{pkg}.py": TEST.format(pkg=pkg, cls=cls),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
