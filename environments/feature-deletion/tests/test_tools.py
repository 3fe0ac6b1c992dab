"""The tool session: the protocol of docs/environments.md, path confinement, specific errors."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from feature_deletion.tool_schemas import TOOLS
from feature_deletion.tools import FeatureDeletionSession, SessionConfig
from sandbox_support import HANDMADE_TASK, STATS_SOLUTION



def call(session: FeatureDeletionSession, name, arguments=None) -> dict:
    return asyncio.run(session.call(name, {} if arguments is None else arguments))


@pytest.fixture
def session(handmade_taskset: Path):
    s = FeatureDeletionSession(handmade_taskset / "tasks" / HANDMADE_TASK, SessionConfig(test_timeout_s=60, grep_timeout_s=3))
    yield s
    asyncio.run(s.close())


def test_schemas_are_openai_functions() -> None:
    names = [t["function"]["name"] for t in TOOLS]
    assert names == ["list_dir", "read_file", "write_file", "edit", "grep", "run_tests", "submit"]
    for t in TOOLS:
        assert t["type"] == "function" and t["function"]["parameters"]["type"] == "object"


def test_private_copy_of_the_task(session: FeatureDeletionSession, handmade_taskset: Path) -> None:
    assert session.repo != handmade_taskset / "tasks" / HANDMADE_TASK / "repo"
    assert (session.repo / "tinylib" / "stats.py").read_text() == (handmade_taskset / "tasks" / HANDMADE_TASK / "repo/tinylib/stats.py").read_text()
    r = call(session, "list_dir", {"depth": 2})
    assert r == {"content": "pyproject.toml\ntests/\n  test_stats.py\ntinylib/\n  __init__.py\n  stats.py",
                 "is_error": False, "done": False}


def test_read_file_with_line_numbers_and_range(session: FeatureDeletionSession) -> None:
    r = call(session, "read_file", {"path": "tinylib/stats.py", "start_line": 4, "end_line": 6})
    assert r["content"] == '    4\tdef mean(xs):\n    5\t    """Arithmetic mean; ValueError on an empty sequence."""\n    6\t    raise NotImplementedError'
    assert call(session, "read_file", {"path": "tinylib/stats.py", "start_line": 99})["is_error"]
    assert "directory" in call(session, "read_file", {"path": "tinylib"})["content"]


def test_write_edit_and_their_errors(session: FeatureDeletionSession) -> None:
    assert not call(session, "write_file", {"path": "tinylib/new/helper.py", "content": "X = 1\n"})["is_error"]
    assert (session.repo / "tinylib/new/helper.py").read_text() == "X = 1\n"
    r = call(session, "edit", {"path": "tinylib/stats.py", "old": "raise NotImplementedError", "new": "return 0"})
    assert r["content"] == "replaced 1 occurrence in tinylib/stats.py"
    assert "return 0" in (session.repo / "tinylib/stats.py").read_text()
    r = call(session, "edit", {"path": "tinylib/stats.py", "old": "no such text", "new": "x"})
    assert r["is_error"] and "not found" in r["content"]
    r = call(session, "edit", {"path": "tinylib/stats.py", "old": "def ", "new": "async def "})
    assert r["is_error"] and "occurs 2 times" in r["content"]


def test_grep(session: FeatureDeletionSession) -> None:
    r = call(session, "grep", {"pattern": r"def (mean|double)"})
    assert r["content"].splitlines() == ["tinylib/stats.py:4: def mean(xs):", "tinylib/stats.py:9: def double(x):"]
    assert call(session, "grep", {"pattern": "zzz_nothing"})["content"] == "no matches"
    r = call(session, "grep", {"pattern": "(unclosed"})
    assert r["is_error"] and "bad regular expression" in r["content"]


def test_grep_catastrophic_regex_times_out(session: FeatureDeletionSession) -> None:
    call(session, "write_file", {"path": "data.txt", "content": "a" * 40 + "!\n"})
    r = call(session, "grep", {"pattern": r"^(a+)+$", "path": "data.txt"})
    assert r["is_error"] and "timed out" in r["content"]


@pytest.mark.parametrize("path, why", [
    ("/etc/passwd", "relative to the repository root"),
    ("../../solution/tinylib/stats.py", "'..'"),
    ("tinylib/../../x", "'..'"),
    ("~/x", "relative to the repository root"),
    ("a\x00b", "NUL"),
    ("nope.py", "file not found"),
])
def test_path_escapes_rejected(session: FeatureDeletionSession, path: str, why: str) -> None:
    for name, args in [("read_file", {"path": path}), ("edit", {"path": path, "old": "a", "new": "b"}),
                       ("list_dir", {"path": path}), ("grep", {"pattern": "x", "path": path})]:
        r = call(session, name, args)
        assert r["is_error"] and why in r["content"], (name, r)
    if why != "file not found":
        r = call(session, "write_file", {"path": path, "content": "x"})
        assert r["is_error"] and why in r["content"]


def test_symlinks_pointing_out_rejected(session: FeatureDeletionSession, handmade_taskset: Path) -> None:
    solution = handmade_taskset / "tasks" / HANDMADE_TASK / "solution" / "tinylib" / "stats.py"
    os.symlink(solution, session.repo / "leak.py")  # as agent code run by run_tests could
    os.symlink(solution.parent, session.repo / "leakdir")
    for name, args in [("read_file", {"path": "leak.py"}), ("write_file", {"path": "leak.py", "content": "x"}),
                       ("edit", {"path": "leak.py", "old": "def", "new": "x"}), ("list_dir", {"path": "leakdir"}),
                       ("read_file", {"path": "leakdir/stats.py"}), ("grep", {"pattern": "def", "path": "leakdir"})]:
        r = call(session, name, args)
        assert r["is_error"] and "outside the repository" in r["content"], (name, r)
    assert solution.read_text() == STATS_SOLUTION


def test_filesystem_errors_are_tool_errors(session: FeatureDeletionSession) -> None:
    r = call(session, "write_file", {"path": "tinylib/stats.py/inner.py", "content": "x"})  # parent is a file
    assert r["is_error"] and r["content"].startswith("Error: ")
    r = call(session, "read_file", {"path": "x" * 5000})
    assert r["is_error"]


def test_special_files_do_not_block(session: FeatureDeletionSession) -> None:
    os.mkfifo(session.repo / "pipe.py")  # agent code run by run_tests could make one
    for name, args in [("read_file", {"path": "pipe.py"}), ("edit", {"path": "pipe.py", "old": "a", "new": "b"}),
                       ("write_file", {"path": "pipe.py", "content": "x"})]:
        r = call(session, name, args)
        assert r["is_error"] and "regular file" in r["content"], (name, r)


@pytest.mark.parametrize("name, args, message", [
    ("frobnicate", {}, "unknown tool 'frobnicate'; the tools are: list_dir, read_file"),
    ("read_file", {}, "missing required argument 'path' for read_file"),
    ("read_file", {"file": "x"}, "unknown argument 'file' for read_file (expected: path, start_line, end_line)"),
    ("read_file", {"path": 3}, "argument 'path' of read_file must be a string, got integer"),
    ("read_file", {"path": "tinylib/stats.py", "start_line": "1"}, "argument 'start_line' of read_file must be a integer"),
    ("run_tests", {"tests": "tests/test_stats.py"}, "argument 'tests' of run_tests must be a list of strings, got string"),
    ("read_file", ["tinylib/stats.py"], "arguments of read_file must be a JSON object, got list"),
    ("submit", {"now": True}, "unknown argument 'now' for submit (expected: no arguments)"),
])
def test_bad_calls_are_specific_errors(session: FeatureDeletionSession, name, args, message) -> None:
    r = call(session, name, args)
    assert r["is_error"] and not r["done"] and message in r["content"], r
    assert session.log.errors[-1][0] == name


def test_run_tests_summary_from_junit(session: FeatureDeletionSession) -> None:
    r = call(session, "run_tests")
    assert not r["is_error"] and r["content"].startswith("4 failed\nNot passing:\n  tests/test_stats.py::test_mean_empty")
    call(session, "write_file", {"path": "tinylib/stats.py", "content": STATS_SOLUTION})
    assert call(session, "run_tests")["content"].startswith("4 passed")
    r = call(session, "run_tests", {"tests": ["tests/test_stats.py::test_double", "tests/test_stats.py"]})
    assert r["content"].startswith("6 passed")
    r = call(session, "run_tests", {"tests": ["--co"]})
    assert r["is_error"] and "not options" in r["content"]


def test_run_tests_output_truncated(session: FeatureDeletionSession) -> None:
    call(session, "write_file", {"path": "tests/test_loud.py", "content": "def test_loud():\n    for i in range(3000):\n        print('line', i)\n    assert False\n"})
    r = call(session, "run_tests", {"tests": ["tests/test_loud.py"]})
    assert r["content"].startswith("1 failed") and "[... truncated ...]" in r["content"] and len(r["content"]) < 7000
    assert "line 2999" in r["content"]  # the tail (the summary) is kept


def test_submit_and_close(session: FeatureDeletionSession) -> None:
    assert call(session, "submit") == {"content": "Submitted. Your changes will now be scored.", "is_error": False, "done": True}
    assert session.submitted
    root = session.root
    asyncio.run(session.close())
    assert not root.exists()
    r = call(session, "read_file", {"path": "tinylib/stats.py"})
    assert r["is_error"] and "closed" in r["content"]


def test_working_copy_has_no_caches(minilib_taskset: Path) -> None:
    task_dir = next((minilib_taskset / "tasks").iterdir())
    repo = task_dir / "repo"
    for rel in ["pkgcache/__pycache__/x.cpython-311.pyc", ".git/HEAD", ".mypy_cache/3.11/x.json", ".ruff_cache/x",
                ".pytest_cache/v/cache/lastfailed", "stray.pyc"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("planted")
    s = FeatureDeletionSession(task_dir)
    try:
        names = {p.name for p in s.repo.rglob("*")}
        assert not names & {"__pycache__", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", "stray.pyc"}
    finally:
        asyncio.run(s.close())


# -- the Taskset: tasks from a built set, a session per rollout, the reward from score_task -------

def test_taskset_loads_scores_and_splits(minilib_taskset: Path) -> None:
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import taskset_class

    from feature_deletion import FeatureDeletionTaskset
    from feature_deletion.taskset import FeatureDeletionConfig

    assert taskset_class("feature-deletion") is FeatureDeletionTaskset
    tasks = list(FeatureDeletionTaskset(FeatureDeletionConfig(taskset_dir=str(minilib_taskset))))
    assert len(tasks) == 2 and "<tool_call>" in tasks[0].data.system_prompt
    task = tasks[0]
    assert task.data.file in task.data.prompt and task.data.qualname in task.data.prompt
    def ids(**kw) -> set[str]:
        return {t.data.id for t in FeatureDeletionTaskset(FeatureDeletionConfig(taskset_dir=str(minilib_taskset), **kw))}

    train, held = ids(split="train", eval_fraction=0.5), ids(split="eval", eval_fraction=0.5)
    assert not train & held and train | held == {t.data.id for t in tasks}
    # eval args without a taskset_dir (an `--orchestrator.envs` override drops eval_args): the set
    # this process loaded last, as the orchestrator loads training tasks just before eval tasks
    assert {t.data.id for t in FeatureDeletionTaskset(FeatureDeletionConfig(split="eval", eval_fraction=0.5))} == held
    assert len(list(FeatureDeletionTaskset(FeatureDeletionConfig(taskset_dir=str(minilib_taskset), num_tasks=1)))) == 1

    async def episode(restore: bool) -> vf.Trace:
        session = await task.open_session()
        try:
            assert [t["function"]["name"] for t in session.tools][-1] == "submit"
            if restore:
                text = (Path(task.data.task_dir) / "solution" / task.data.file).read_text()
                await session.call("write_file", {"path": task.data.file, "content": text})
            await session.call("nope", {})
            assert (await session.call("submit", {}))["done"]
            trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                             agent=vf.AgentInfo(config=vf.AgentConfig()), root_reply="")
            await task.score(trace, runtime=session)
            return trace
        finally:
            await session.close()

    good, bad = asyncio.run(episode(True)), asyncio.run(episode(False))
    assert (good.reward, bad.reward) == (1.0, 0.0)
    assert good.metrics == {"regressions": 0.0, "submitted": 1.0, "tests_passed_fraction": 1.0, "tool_errors": 1.0}
