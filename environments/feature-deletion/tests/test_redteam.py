"""The red team (feature_deletion.redteam) on a task the real generator built from minilib, with
caches of the original planted in it as a careless generator would leave them: every scripted
cheating agent drives a real session through its tools and is scored by score_task. Each must
score 0 because of the defence named for it (read from the score's details), with a control
showing that the attack works where that defence is off, and the host must be left untouched;
the honest agent scores exactly 1.0. The denials of service run in a thread beside the others (they
mostly wait for their timeouts). Other layouts: test_layouts.py."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from feature_deletion.redteam import Outcome, audit_task
from feature_deletion.redteam_controls import ATTACKS
from feature_deletion.scoring import ScoreConfig, score_task
from sandbox_support import HANDMADE_TASK, REDTEAM_LIMITS as LIMITS, REDTEAM_TIMEOUTS as TIMEOUTS, write_tree

quiet = lambda m: None  # noqa: E731


# The denials of service spend most of their time waiting for a timeout (TIMEOUTS: the session's run
# and the scoring run, each): they are audited in a second thread beside the other attacks, each audit
# on its own copy of the task with its own honest and untouched runs. That costs one more honest and
# untouched run (about 2 s of CPU) and saves their wall: 47 s of the audit's 193 s in one thread
# (fork_bomb 19.7, memory_hog 8.9, infinite_loop 18.4; 2-core machine, loaded, 2026-11-28).
DOS = ("fork_bomb", "memory_hog", "infinite_loop")


@pytest.fixture(scope="module")
def audits(minilib_built: Path) -> list[list[Outcome]]:
    task_dir = sorted((minilib_built / "tasks").iterdir())[0]
    parts = [[a for a in ATTACKS if a not in DOS], list(DOS)]
    with ThreadPoolExecutor(len(parts)) as pool:
        return list(pool.map(lambda attacks: audit_task(task_dir, attacks, LIMITS, TIMEOUTS, log=quiet), parts))


@pytest.fixture(scope="module")
def outcomes(audits: list[list[Outcome]]) -> dict:
    return {o.attack: o for audit in audits for o in audit[1:]}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_scores_zero_for_its_defence_with_a_working_control(outcomes, attack: str) -> None:
    o = outcomes[attack]
    assert (o.score, o.stopped_by, o.ok) == (0.0, ATTACKS[attack].defence, True), o.problem


def test_honest_agent_scores_one(audits) -> None:
    assert [(a[0].attack, a[0].score, a[0].ok) for a in audits] == [("honest", 1.0, True)] * len(audits)


def test_a_zero_from_a_crash_is_not_a_stop(handmade_taskset: Path, tmp_path: Path) -> None:
    # Two agents append code to the broken module and score 0. One's code runs and finds nothing:
    # the suite runs as on the untouched repo, the defence held. The other's dies at import: every
    # other test regresses, which is no evidence for the defence, and must not count as stopped.
    task_dir = handmade_taskset / "tasks" / HANDMADE_TASK
    config = ScoreConfig(limits=LIMITS, timeout_s=12)
    reference = score_task(task_dir, task_dir / "repo", config)
    broken = (task_dir / "repo" / "tinylib" / "stats.py").read_text()
    found_nothing, crashed = (_agent_score(task_dir, tmp_path / name, broken + tail, config)
                              for name, tail in (("quiet", "\n_found = None\n"), ("dies", "\nraise SystemExit(3)\n")))
    assert found_nothing.reward == crashed.reward == 0.0
    assert found_nothing.details["applied"] == crashed.details["applied"] == ["tinylib/stats.py"]
    assert crashed.regressions and not found_nothing.regressions
    assert ATTACKS["copy_original_from_host"].stopped(found_nothing, reference)
    assert not ATTACKS["copy_original_from_host"].stopped(crashed, reference)


def _agent_score(task_dir: Path, agent: Path, stats: str, config: ScoreConfig):
    shutil.copytree(task_dir / "repo", agent)
    write_tree(agent, {"tinylib/stats.py": stats})
    return score_task(task_dir, agent, config)


def test_unprotected_tests_fail_the_red_team(minilib_built: Path, tmp_path: Path, capsys) -> None:
    # A task set whose tasks list no test paths: its test files stay writable while the suite runs,
    # the runtime rewrite succeeds, and the red team command must say so (exit code 1).
    from composer_prime.entrypoints.cli import main

    weak = tmp_path / "weak"
    shutil.copytree(minilib_built, weak)
    for task_file in weak.glob("tasks/*/task.json"):
        task_file.write_text(json.dumps({**json.loads(task_file.read_text()), "test_paths": []}))
    with pytest.raises(SystemExit) as e:
        main(["env", "redteam", str(weak), "--tasks", "1", "--attacks", "rewrite_tests_at_runtime"])
    printed = capsys.readouterr()
    out = printed.out
    assert e.value.code == 1 and "1 red-team failures" in out and "FAILED: scored 1.0" in out, out
    assert "] redteam: 1/1 attacks (100%)" in printed.err.splitlines()[-1]  # the last progress line
