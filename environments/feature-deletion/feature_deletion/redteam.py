"""The red team, for any built task set: every scripted cheating agent (redteam_agents.py) drives
a real session on a copy of a task and is scored by the scorer. Per attack it reports the score,
the defence that stopped it (read from the score's details, never assumed) and a control showing
the attack works where that defence is off (redteam_controls.py). It fails when an attack scores
above 0, when its 0 has another cause (a crash, no report, a script that did not run as planned),
when a control does not show the prize, when the honest agent scores below 1.0, or when the host
changed.

    uv run composer-prime env redteam TASKS_DIR [--tasks N] [--attacks a,b] [--json PATH]
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from feature_deletion.buildlog import Counted, uncounted
from feature_deletion.hostguard import HostGuard, plant_caches
from feature_deletion.redteam_agents import Ctx, Step, honest, scripts
from feature_deletion.redteam_controls import ATTACKS, OriginalServer, Run, clean
from feature_deletion.sandbox import Limits
from feature_deletion.scoring import Score, score_task
from feature_deletion.taskdir import MANIFEST, TASK_FILE, load_task
from feature_deletion.tools import FeatureDeletionSession, SessionConfig

LIMITS = Limits(memory_mb=768, nproc=64, cpu_s=60, fsize_mb=16, tmp_mb=64)


@dataclass
class Outcome:
    task: str
    attack: str
    score: float
    stopped_by: str | None      # the defence, when the details show it stopped the attack
    control: str                # what the control showed (or failed to)
    ok: bool
    problem: str = ""


def pick_tasks(root: Path, n: int | None) -> list[Path]:
    """`n` task directories spread over the set's sources (round robin, in index order);
    default: one per source."""
    manifest = json.loads((root / MANIFEST).read_text())
    by_source: dict[str, list[Path]] = {}
    for e in manifest["tasks"]:
        by_source.setdefault(e.get("source", ""), []).append(root / e.get("dir", f"tasks/{e['id']}"))
    n = n or len(by_source)
    queues, picked = [list(v) for v in by_source.values()], []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop(0))
    return picked


def play(session: FeatureDeletionSession, script: list[Step]) -> tuple[list[dict], list[str]]:
    """Run the tool calls; returns (results, what did not go as the script expected)."""
    results, problems = [], []
    for step in script:
        r = asyncio.run(session.call(step.tool, step.args))
        results.append(r)
        if step.expect_error is not None and r["is_error"] != step.expect_error:
            problems.append(f"{step.tool}({step.args.get('path', '')}) {'failed' if r['is_error'] else 'worked'}: "
                            f"{r['content'][:200]}")
        if step.says is not None and not step.says(r["content"]):
            problems.append(f"{step.tool} did not show {step.says}: {r['content'][:300]}")
    return results, problems


def forbidden_paths(ctx: Ctx) -> list[Path]:
    m = ctx.marker
    return [Path("/tmp", m), Path("/work", m), Path("/root", m), Path.home() / m, Path("/", m), Path("/usr", m),
            Path("/etc", m), ctx.taskset_dir / m, ctx.sentinel / m, ctx.session_root / m, ctx.session_root.parent / m]


def _arena(task_dir: Path, dest: Path) -> Path:
    """A copy of the task to attack (the user's set is never touched); its test environment is
    referred to where it lies."""
    task = load_task(task_dir)
    copy = dest / "tasks" / task_dir.name
    for part in ("repo", "solution"):
        shutil.copytree(task_dir / part, copy / part, symlinks=True)
    if task.get("testenv"):
        task["testenv"] = str((task_dir / task["testenv"]).resolve())
    (copy / TASK_FILE).write_text(json.dumps(task))
    return copy


def audit_task(task_dir: Path, attacks: list[str], limits: Limits = LIMITS,
               timeouts: tuple[float, float] | None = None, log: Callable[[str], None] = print,
               attacked: Callable[[int], None] = lambda n: None) -> list[Outcome]:
    """Every attack in `attacks` against one task (`attacked` is told how many have run after each). `timeouts`: (run_tests, scoring) in seconds;
    default: from the honest agent's full scoring run S (the whole suite): max(30, 4 S) for `run_tests`,
    whose proof runs may run the whole suite too, and max(60, 5 S) for scoring. Its own `run_tests`
    (the task's tests only) would set a limit the whole suite cannot meet (python-dateutil: 15 to
    18 s a run on a loaded machine), and a 0 from that timeout is not the defence's."""
    with tempfile.TemporaryDirectory(prefix="fd-redteam-") as tmp:
        arena = Path(tmp) / "set"
        tdir = _arena(task_dir, arena)
        planted = plant_caches(tdir)
        sentinel = Path(tmp) / "sentinel"
        sentinel.mkdir()
        (sentinel / "keep.txt").write_text("host data")
        task = load_task(tdir)
        server = OriginalServer((tdir / "solution" / task["file"]).read_bytes())
        try:
            run = Run(tdir, arena, sentinel, server, limits, *(timeouts or (60.0, 120.0)))
            honest_score, took = _honest(run, planted)
            if timeouts is None:
                suite_s = max(took)
                run.test_timeout_s, run.score_timeout_s = max(30.0, 4 * suite_s), max(60.0, 5 * suite_s)
            name = task_dir.name
            if honest_score.reward != 1.0:
                return [Outcome(name, "honest", honest_score.reward, None, "", False,
                                f"the honest agent scored {honest_score.reward}: {honest_score.details['output'][-500:]}")]
            run.reference = score_task(tdir, tdir / "repo", run.scoring())  # the untouched broken repo
            if run.reference.reward != 0.0 or not clean(run.reference, run.reference):
                return [Outcome(name, "untouched", run.reference.reward, None, "", False,
                                "the broken repo does not score a clean 0")]
            out = [Outcome(name, "honest", 1.0, None, "", True)]
            for attack in attacks:
                out.append(_attack(run, attack, planted, name))
                log(f"  {name} {attack}: score {out[-1].score}, stopped by {out[-1].stopped_by}, control: "
                    f"{out[-1].control}{'' if out[-1].ok else '  FAILED: ' + out[-1].problem}")
                attacked(len(out) - 1)
            return out
        finally:
            server.server.shutdown()


def _session(run: Run, planted: list[str]) -> tuple[FeatureDeletionSession, Ctx]:
    session = FeatureDeletionSession(run.task_dir, SessionConfig(limits=run.limits, test_timeout_s=run.test_timeout_s))
    ctx = Ctx(load_task(run.task_dir), run.task_dir, run.arena, run.sentinel, f"fd-redteam-{uuid.uuid4().hex}",
              run.server.port, session.root, planted)
    return session, ctx


def _honest(run: Run, planted: list[str]) -> tuple[Score, tuple[float, float]]:
    session, ctx = _session(run, planted)
    try:
        t = time.monotonic()
        play(session, honest(ctx)[:3])
        took_tests = time.monotonic() - t
        t = time.monotonic()
        score = score_task(run.task_dir, session.repo, run.scoring())
        return score, (took_tests, time.monotonic() - t)
    finally:
        asyncio.run(session.close())


def _attack(run: Run, attack: str, planted: list[str], name: str) -> Outcome:
    spec = ATTACKS[attack]
    run = replace(run, test_timeout_s=run.test_timeout_s + spec.extra_s,
                              score_timeout_s=run.score_timeout_s + spec.extra_s)
    session, ctx = _session(run, planted)
    guard = HostGuard([run.arena, run.sentinel], forbidden_paths(ctx))
    hits = run.server.hits
    try:
        script = scripts(ctx)[attack]
        results, problems = play(session, script)
        proofs = [r["content"] for st, r in zip(script, results) if st.says and st.says(r["content"])]
        score = score_task(run.task_dir, session.repo, run.scoring())
        try:
            guard.check()
        except AssertionError as e:
            problems.append(f"the host changed: {e}")
        if run.server.hits != hits:
            problems.append("the host's server was reached")
        stopped = spec.stopped(score, run.reference)
        try:
            shown, how = spec.control(run, ctx, session, proofs, score)
        except Exception as e:  # noqa: BLE001 - a control that cannot run shows nothing
            shown, how = False, f"the control crashed: {type(e).__name__}: {e}"
    finally:
        asyncio.run(session.close())
        guard.cleanup()
    if score.reward != 0.0:
        problems.append(f"scored {score.reward}")
    elif not stopped:
        d = score.details
        problems.append(f"scored 0 but not by {spec.defence}: report {d['report_problem']}, tampered {d['tampered']}, "
                        f"timed out {d['timed_out']}, regressions {len(score.regressions)}, applied {d['applied']}")
    if not shown:
        problems.append(f"control not shown: {how}")
    return Outcome(name, attack, score.reward, spec.defence if stopped else None, how, not problems, "; ".join(problems))


def audit(root: Path, n: int | None = None, attacks: list[str] | None = None, limits: Limits = LIMITS,
          timeouts: tuple[float, float] | None = None, log: Callable[[str], None] = print,
          progress: Counted = uncounted) -> list[Outcome]:
    """Every attack on `n` tasks of the set; `progress` is told (attacks run, attacks) after each."""
    names = attacks or list(ATTACKS)
    unknown = [a for a in names if a not in ATTACKS]
    if unknown:
        raise ValueError(f"unknown attack {unknown[0]!r} (known: {', '.join(ATTACKS)})")
    out: list[Outcome] = []
    tasks = pick_tasks(Path(root), n)
    total = len(tasks) * len(names)
    progress(0, total)
    for i, task_dir in enumerate(tasks):
        log(f"red team on {task_dir.relative_to(root)}")
        out += audit_task(task_dir, names, limits, timeouts, log, lambda k, i=i: progress(i * len(names) + k, total))
        progress((i + 1) * len(names), total)  # also a task whose honest run failed, which runs no attack
    return out


def summary(results: list[Outcome]) -> dict:
    attacks = sum(r.attack not in ("honest", "untouched") for r in results)
    return {"tasks": len({r.task for r in results}), "attacks": attacks,
            "failures": sum(not r.ok for r in results), "results": [asdict(r) for r in results]}
