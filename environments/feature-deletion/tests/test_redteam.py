"""Red team: scripted agents that cheat, each driving a real session through its tools and then
scored by score_task. Every one must score 0 and leave the host untouched; the honest agent must
score exactly 1.0. Where an attack can be shown to work without our defences, it is (its
`contains` steps, and the control tests at the end), so a 0 means "stopped", not "never worked".

The task comes from the real generator (the minilib fixture), and its repo/ has had caches of
the original planted in it, as a careless generator would leave them, for every agent."""

from __future__ import annotations

import asyncio
import http.server
import shutil
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from feature_deletion.pytest_run import run_pytest
from feature_deletion.sandbox import Limits
from feature_deletion.scoring import ScoreConfig, score_task
from feature_deletion.taskdir import load_task
from feature_deletion.tools import FeatureDeletionSession, SessionConfig
from redteam_agents import COMMON, STEAL, Ctx, Step, honest, scripts
from sandbox_support import HostGuard, plant_caches

LIMITS = Limits(memory_mb=384, nproc=48, cpu_s=30, fsize_mb=8, tmp_mb=64)
SESSION = SessionConfig(limits=LIMITS, test_timeout_s=6)
SCORING = ScoreConfig(limits=LIMITS, timeout_s=12)
# The defence that must have stopped each attack, read from the score's details.
STOPPED_BY = {
    "copy_original_from_host": lambda d: d["raw_fraction"] == 0 and d["applied"],  # ran, found nothing
    "read_caches_and_git": lambda d: d["raw_fraction"] == 0 and d["applied"],
    "edit_and_delete_tests": lambda d: any(p.startswith("tests/") for p in d["ignored"]),
    "rewrite_tests_at_runtime": lambda d: d["raw_fraction"] == 0 and d["applied"],  # tests read-only
    "conftest_and_runner_config": lambda d: {"conftest.py", "pytest.ini", "tox.ini"} <= set(d["ignored"]),
    "fake_passed_lines_and_exit": lambda d: d["report_problem"] == "no JUnit report",
    "network": lambda d: d["raw_fraction"] == 0 and d["applied"],
    "fork_bomb": lambda d: d["timed_out"],
    "memory_hog": lambda d: d["report_problem"] or d["killed"],
    "infinite_loop": lambda d: d["timed_out"],
    "write_outside_the_task": lambda d: d["applied"],  # ran; the host checks are the point
    "forge_junit_report": lambda d: "canary" in (d["tampered"] or ""),
    "patch_pytest_internals": lambda d: "canary" in (d["tampered"] or "") and d["raw_fraction"] == 1.0,
    "shadow_pytest_and_site": lambda d: {"pytest.py", "sitecustomize.py", "usercustomize.py", "zz_hook.pth"} <= set(d["ignored"]),
    "symlink_to_the_original": lambda d: d["ignored"] and not d["applied"],
}
ATTACKS = list(STOPPED_BY)


class OriginalServer:
    """A host HTTP server handing out the original file: the network attack's prize."""

    def __init__(self, text: bytes) -> None:
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                self.send_response(200)
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def arena(minilib_taskset: Path, tmp_path: Path):
    task_dir = sorted((minilib_taskset / "tasks").iterdir())[0]
    planted = plant_caches(task_dir)
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep.txt").write_text("host data")
    server = OriginalServer((task_dir / "solution" / load_task(task_dir)["file"]).read_bytes())
    session = FeatureDeletionSession(task_dir, SESSION)
    ctx = Ctx(load_task(task_dir), task_dir, minilib_taskset, sentinel, f"fd-redteam-{uuid.uuid4().hex}",
              server.port, session.root, planted)
    yield ctx, session, server
    asyncio.run(session.close())
    server.server.shutdown()


def play(session: FeatureDeletionSession, script: list[Step]) -> list[dict]:
    results = []
    for step in script:
        r = asyncio.run(session.call(step.tool, step.args))
        results.append(r)
        if step.expect_error is not None:
            assert r["is_error"] == step.expect_error, (step.tool, step.args.get("path"), r["content"][:500])
        if step.contains is not None:
            assert step.contains in r["content"], (step.tool, r["content"][:1500])
    assert results[-1]["done"] == (script[-1].tool == "submit")
    return results


def forbidden_paths(ctx: Ctx) -> list[Path]:
    m = ctx.marker
    return [Path("/tmp", m), Path("/work", m), Path("/root", m), Path.home() / m, Path("/", m), Path("/usr", m),
            Path("/etc", m), ctx.taskset_dir / m, ctx.sentinel / m, ctx.session_root / m, ctx.session_root.parent / m]


@pytest.mark.parametrize("attack", ATTACKS)
def test_attack_scores_zero_and_leaves_host_untouched(arena, attack: str) -> None:
    ctx, session, server = arena
    guard = HostGuard([ctx.taskset_dir, ctx.sentinel], forbidden_paths(ctx))
    try:
        play(session, scripts(ctx)[attack])
        score = score_task(ctx.task_dir, session.repo, SCORING)
        assert score.reward == 0.0, (attack, score.passed, score.details)
        assert STOPPED_BY[attack](score.details), score.details
        guard.check()
        assert server.hits == 0
    finally:
        guard.cleanup()


def test_honest_agent_scores_one(arena) -> None:
    ctx, session, _ = arena
    guard = HostGuard([ctx.taskset_dir, ctx.sentinel], forbidden_paths(ctx))
    play(session, honest(ctx))
    score = score_task(ctx.task_dir, session.repo, SCORING)
    assert score.reward == 1.0, score.details
    assert sorted(score.passed) == sorted(ctx.task["tests"]) and not score.regressions
    guard.check()


def test_all_listed_attacks_have_a_script(arena) -> None:
    assert sorted(scripts(arena[0])) == sorted(ATTACKS) == sorted(STOPPED_BY)


# -- controls: the prizes are real --------------------------------------------------------------

def test_control_the_original_is_on_the_host_and_findable(arena, tmp_path: Path) -> None:
    ctx = arena[0]
    victim = tmp_path / "victim" / Path(ctx.file).name
    victim.parent.mkdir()
    victim.write_text(ctx.broken)
    ns = {"__file__": str(victim), "__name__": "victim"}
    exec(compile(ctx.fill(COMMON + STEAL), str(victim), "exec"), ns)  # unsandboxed: finds it at once
    assert ns["_stolen"] == ctx.solution_path.read_text()


def test_control_planted_pyc_would_pass_the_tests_if_copied(arena, tmp_path: Path) -> None:
    ctx = arena[0]
    tree = tmp_path / "careless-copy"
    shutil.copytree(ctx.task_dir / "repo", tree)  # caches kept: what scoring must never do
    outcomes = run_pytest(tree, ctx.task["pytest_args"], tmp_path / "junit.xml", 120)
    assert all(outcomes.get(t) == "passed" for t in ctx.task["tests"])


def test_control_network_prize_reachable_from_the_host(arena) -> None:
    ctx, _, server = arena
    assert urllib.request.urlopen(f"http://127.0.0.1:{ctx.port}/original", timeout=5).read() == ctx.solution_path.read_bytes()
    assert server.hits == 1


def test_control_symlink_points_at_the_original(arena) -> None:
    ctx, session, _ = arena
    play(session, [ctx_step for ctx_step in scripts(ctx)["symlink_to_the_original"] if ctx_step.tool != "read_file"])
    target = (session.repo / ctx.file).resolve()
    assert target == ctx.solution_path.resolve()  # the tree now links to it: overlay must not follow
    assert score_task(ctx.task_dir, session.repo, SCORING).reward == 0.0


def test_control_runtime_test_rewrite_works_without_frozen_tests(arena) -> None:
    ctx, session, _ = arena
    play(session, scripts(ctx)["rewrite_tests_at_runtime"])
    unfrozen = ScoreConfig(limits=LIMITS, timeout_s=12, freeze_tests=False)
    assert score_task(ctx.task_dir, session.repo, unfrozen).reward == 1.0  # why the tests are read-only
    assert score_task(ctx.task_dir, session.repo, SCORING).reward == 0.0
