"""feature-deletion: rebuild a function deleted from a real Python project, with tools in a sandbox.

Tasks come from a task set built by `feature_deletion.generate` (`manifest.json` + `tasks/<id>/`).
Each rollout opens a FeatureDeletionSession (a private working copy and its tools); the reward
is `score_task` on that copy: the fraction of the deleted function's tests passing, 0 if any other
previously passing test now fails (`regressions_zero`) or the test run was tampered with.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import verifiers.v1 as vf

from feature_deletion import sandbox
from feature_deletion.scoring import Score, ScoreConfig, score_task
from feature_deletion.taskdir import MANIFEST, load_task
from feature_deletion.tools import FeatureDeletionSession, SessionConfig

SYSTEM_PROMPT = """\
You are a software engineer working in a Python repository. One function has lost its \
implementation: its body now raises NotImplementedError. Rebuild it so that its tests pass \
again, without breaking any other test.

Tools (all paths are relative to the repository root):
- list_dir(path=".", depth=1): list a directory
- read_file(path, start_line?, end_line?): read a file, with line numbers
- write_file(path, content): create or overwrite a file
- edit(path, old, new): replace the exact text `old`, which must occur once, with `new`
- grep(pattern, path="."): search with a Python regular expression
- run_tests(tests?): run pytest on test ids (default: the tests of the deleted function)
- submit(): finish; your work is scored

Call one tool per reply by writing
<tool_call>{"name": "read_file", "arguments": {"path": "pkg/mod.py"}}</tool_call>
The result comes back in the next message. Only your changes to the package's source files \
count: tests and configuration are restored before scoring. Call submit when the tests pass."""


class FeatureDeletionData(vf.TaskData):
    task_dir: str
    file: str
    qualname: str
    tests: list[str]


class FeatureDeletionTaskConfig(vf.TaskConfig):
    regressions_zero: bool = True
    test_timeout_s: float = 120.0  # one run_tests call
    score_timeout_s: float = 600.0  # the scoring run (task tests + every baseline test)
    memory_mb: int = 2048
    nproc: int = 256
    cpu_s: int = 300
    fsize_mb: int = 64
    cgroups: str = "auto"

    def limits(self) -> sandbox.Limits:
        return sandbox.Limits(memory_mb=self.memory_mb, nproc=self.nproc, cpu_s=self.cpu_s,
                              fsize_mb=self.fsize_mb, cgroups=self.cgroups)


class FeatureDeletionTask(vf.Task[FeatureDeletionData, vf.State, FeatureDeletionTaskConfig]):
    async def open_session(self) -> FeatureDeletionSession:
        await asyncio.to_thread(sandbox.ensure_available)  # a clear error before the first turn
        config = SessionConfig(limits=self.config.limits(), test_timeout_s=self.config.test_timeout_s)
        return await asyncio.to_thread(FeatureDeletionSession, Path(self.data.task_dir), config)

    async def _score(self, runtime: FeatureDeletionSession) -> Score:
        # Rewards and metrics run concurrently: one scoring run, shared through the session.
        if runtime.score is None:
            config = ScoreConfig(regressions_zero=self.config.regressions_zero,
                                 timeout_s=self.config.score_timeout_s, limits=self.config.limits())
            runtime.score = asyncio.ensure_future(
                asyncio.to_thread(score_task, Path(self.data.task_dir), runtime.repo, config))
        return await runtime.score

    @vf.reward(weight=1.0)
    async def tests_passing(self, trace: vf.Trace, runtime: FeatureDeletionSession) -> float:
        return (await self._score(runtime)).reward

    @vf.metric
    async def tests_passed_fraction(self, trace: vf.Trace, runtime: FeatureDeletionSession) -> float:
        return float((await self._score(runtime)).details["raw_fraction"])

    @vf.metric
    async def regressions(self, trace: vf.Trace, runtime: FeatureDeletionSession) -> float:
        return float(len((await self._score(runtime)).regressions))

    @vf.metric
    async def tool_errors(self, trace: vf.Trace, runtime: FeatureDeletionSession) -> float:
        return float(len(runtime.log.errors))

    @vf.metric
    async def submitted(self, trace: vf.Trace, runtime: FeatureDeletionSession) -> float:
        return float(runtime.submitted)


class FeatureDeletionConfig(vf.TasksetConfig):
    # A task set built by `composer-prime env build-tasks` (one source or an index of many).
    # Empty: the one this process loaded last, so eval args need not repeat the training set's.
    taskset_dir: str = ""
    split: str = "all"  # "all" | "train" | "eval": a stable split by hash of the task id
    eval_fraction: float = 0.1
    num_tasks: int | None = None
    task: FeatureDeletionTaskConfig = FeatureDeletionTaskConfig()


def user_prompt(task: dict) -> str:
    helpers = [d["qualname"] for d in task.get("deleted", []) if d.get("kind") == "removed"]
    tests = task["tests"]
    shown = "\n".join(f"- {t}" for t in tests[:20]) + (f"\n- ... and {len(tests) - 20} more" if len(tests) > 20 else "")
    lines = [f"The body of `{task['qualname']}` in `{task['file']}` was deleted (it raises NotImplementedError)."]
    if helpers:
        lines.append(f"Private helpers it used were removed from the file too: {', '.join(f'`{h}`' for h in helpers)}.")
    lines += [f"Rebuild it. These tests exercise it:\n{shown}",
              "`run_tests` with no arguments runs exactly these. Call `submit` when they pass."]
    return "\n\n".join(lines)


def in_split(task_id: str, split: str, eval_fraction: float) -> bool:
    if split == "all":
        return True
    bucket = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    is_eval = bucket < eval_fraction
    if split not in ("train", "eval"):
        raise ValueError(f"split must be all, train or eval, got {split!r}")
    return is_eval == (split == "eval")


_last_loaded: list[Path] = []  # the task set this process loaded last (see FeatureDeletionConfig.taskset_dir)


class FeatureDeletionTaskset(vf.Taskset[FeatureDeletionTask, FeatureDeletionConfig]):
    def load(self) -> list[FeatureDeletionTask]:
        if self.config.taskset_dir:
            root = Path(self.config.taskset_dir).expanduser().resolve()
        elif _last_loaded:  # the orchestrator loads an env's training tasks just before its eval tasks
            root = _last_loaded[-1]
        else:
            raise ValueError("feature-deletion needs taskset_dir: a task set built with "
                             "`composer-prime env build-tasks feature-deletion`")
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"no {MANIFEST} in {root}: not a built task set (make one with "
                                    f"`composer-prime env build-tasks feature-deletion --source <sdist|dir> --out {root}`)")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("env") != "feature-deletion" or manifest.get("format") != 1:
            raise ValueError(f"{manifest_path} is not a feature-deletion task set (format 1)")
        _last_loaded.append(root)
        tasks = []
        for entry in manifest["tasks"]:  # an index's entries name their directory and a unique id
            if not in_split(entry["id"], self.config.split, self.config.eval_fraction):
                continue
            task_dir = root / entry.get("dir", f"tasks/{entry['id']}")
            task = load_task(task_dir)
            data = FeatureDeletionData(
                id=entry["id"], prompt=user_prompt(task), system_prompt=SYSTEM_PROMPT, task_dir=str(task_dir),
                file=task["file"], qualname=task["qualname"], tests=list(task["tests"]),
            )
            tasks.append(FeatureDeletionTask(data, self.config.task))
            if self.config.num_tasks is not None and len(tasks) >= self.config.num_tasks:
                break
        return tasks
