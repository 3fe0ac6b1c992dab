"""Bad input to the tools, as a new user types it: `composer-prime traces ingest|replay|dataset` and
`composer-prime env build-tasks|redteam|serve` answer a missing or malformed input, an output they
cannot write and a source that cannot be built from with one line on stderr, exit code 2, no
traceback, and nothing written: the test's directory holds afterwards just what it held before
(no output, no `.build.log` beside it, no partial directory).

The runner is tests/support/bad_input.py's, shared with test_bad_input.py (the processes' rows).
The PyPI row asks the real index for a project that does not exist.
"""

import json

import pytest

from composer_prime.traces.ingest import ingest
from composer_prime.traces.record import write_steps
from tests.conftest import ROOT
from tests.support.bad_input import fill, listing, run_bad_input, scaffold

SESSIONS = str(ROOT / "tests" / "fixtures" / "traces" / "claude")
OPENENV_BAD = str(ROOT / "tests" / "fixtures" / "openenv_traces" / "malformed")  # an OpenEnv export one mask short
MINILIB = str(ROOT / "environments" / "feature-deletion" / "tests" / "fixtures" / "minilib")
REPLAY = ["traces", "replay", "{steps}", "--teachers", "{teachers}"]
DATASET = ["traces", "dataset", "{pairs}", "--model", "tiny"]
BUILD = ["env", "build-tasks", "feature-deletion"]
ROWS = [
    # traces ingest
    (["traces", "ingest", "{tmp}/missing", "--out", "{tmp}/out.jsonl"], "error: {tmp}/missing: no such file or directory$"),
    (["traces", "ingest", "{dir}", "--out", "{tmp}/out.jsonl"], "error: no assistant steps found in {dir}"),
    (["traces", "ingest", SESSIONS, "--out", "{file}/out.jsonl"], "error: --out: {file} is not a directory$"),
    (["traces", "ingest", SESSIONS, "--out", "{dir}"], "error: --out: {dir} is a directory; name a file$"),
    (["traces", "ingest", OPENENV_BAD, "--out", "{tmp}/out.jsonl"], f"error: {OPENENV_BAD}/short-mask.json:1: not an "
     "OpenEnv TrainingTrace v1 (turns.1: Value error, invalid training turn: [FATAL] length_mismatch: loss_mask must "
     "cover prompt plus completion)$"),
    # traces replay
    (["traces", "replay", "{tmp}/missing.jsonl", "--teachers", "{teachers}", "--out", "{tmp}/out"],
     "error: {tmp}/missing.jsonl: No such file or directory$"),
    (["traces", "replay", "{file}", "--teachers", "{teachers}", "--out", "{tmp}/out"], "error: {file}:1: not JSON ("),
    (["traces", "replay", "{pairs}", "--teachers", "{teachers}", "--out", "{tmp}/out"],
     "error: {pairs}: not steps from `traces ingest` ("),
    (["traces", "replay", "{steps}", "--teachers", "{tmp}/missing.toml", "--out", "{tmp}/out"],
     "error: {tmp}/missing.toml: No such file or directory$"),
    (["traces", "replay", "{steps}", "--teachers", "{bad_toml}", "--out", "{tmp}/out"], "error: {bad_toml}: not TOML ("),
    (["traces", "replay", "{steps}", "--teachers", "{no_url}", "--out", "{tmp}/out"],
     "error: {no_url}: teachers.0.base_url: Field required$"),
    ([*REPLAY, "--out", "{file}/out"], "error: --out: {file} is not a directory (on the way to {file}/out)$"),
    ([*REPLAY, "--out", "{file}"], "error: --out: {file} is not a directory$"),
    # traces dataset
    (["traces", "dataset", "{tmp}/missing.jsonl", "--model", "tiny", "--out", "{tmp}/out"],
     "error: {tmp}/missing.jsonl: No such file or directory$"),
    (["traces", "dataset", "{file}", "--model", "tiny", "--out", "{tmp}/out"], "error: {file}:1: not JSON ("),
    (["traces", "dataset", "{pairs}", "--model", "{tmp}/no-model", "--out", "{tmp}/out"],
     "error: model directory not found: {tmp}/no-model$"),
    ([*DATASET, "--out", "{file}/out"], "error: --out: {file} is not a directory (on the way to {file}/out)$"),
    ([*DATASET, "--out", "{file}"], "error: --out: {file} is not a directory$"),
    ([*DATASET, "--out", "{tasks}"], "error: --out {tasks} holds something other than a dataset; name a new directory$"),
    # env build-tasks
    ([*BUILD, "--source", "{tmp}/missing", "--out", "{tmp}/out"], "error: source not found: {tmp}/missing$"),
    ([*BUILD, "--sources", "{tmp}/missing.txt", "--out", "{tmp}/out"], "error: sources file not found: {tmp}/missing.txt$"),
    ([*BUILD, "--source", "pypi:no-such-project-xyz==1.0", "--out", "{tmp}/out"],
     "error: pip download no-such-project-xyz==1.0 failed: "),
    ([*BUILD, "--source", "pypi:inflection", "--out", "{tmp}/out"],
     "error: pypi source must pin one version, e.g. pypi:inflection==0.5.1 (got pypi:inflection)$"),
    ([*BUILD, "--source", "{file}", "--out", "{tmp}/out"], "error: not an sdist (.tar.gz or .zip) or a directory: {file}$"),
    ([*BUILD, "--source", MINILIB, "--out", "{file}/out"], "error: --out: {file} is not a directory (on the way to {file}/out)$"),
    ([*BUILD, "--source", MINILIB, "--out", "{file}"], "error: --out: {file} is not a directory$"),
    # env redteam
    (["env", "redteam", "{tmp}/missing"], "error: no manifest.json in {tmp}/missing: not a built task set$"),
    (["env", "redteam", "{bad_tasks}"], "error: {bad_tasks}/manifest.json: not a task set's manifest ("),
    (["env", "redteam", "{tasks}", "--tasks", "0"], "error: --tasks must be at least 1$"),
    (["env", "redteam", "{tasks}", "--json", "{file}/redteam.json"], "error: --json: {file} is not a directory$"),
    (["env", "redteam", "{tasks}", "--json", "{dir}"], "error: --json: {dir} is a directory; name a file$"),
    # env serve (a port in use: tests/integration/test_env_serve.py, which holds one)
    (["env", "serve", "no-such-env"], "error: environment 'no-such-env' is not installed: install its package with "),
    (["env", "serve", "tool-calc", "--host", "0.0.0.0"],
     "error: --host = 0.0.0.0 listens beyond loopback, where anyone who reaches it could run the environment's tools"),
    (["env", "serve", "tool-calc", "--max-concurrent-envs", "0"], "error: --max-concurrent-envs must be at least 1$"),
    (["env", "serve", "tool-calc", "--args", "{not json"], "error: --args is not JSON: "),
    (["env", "serve", "tool-calc", "--args", '{"num_tasks": "many"}'], "error: environment 'tool-calc': bad args: num_tasks: "),
    (["env", "serve", "tool-calc", "--auth.keys_dir", "{dir}"], "error: auth.keys_dir {dir}: no inference.token; "),
]


def inputs(tmp_path) -> dict[str, str]:
    """The well-formed inputs each bad row spoils one of: steps, teachers, pairs, a task set's manifest."""
    steps, _, _, _ = ingest([ROOT / "tests" / "fixtures" / "traces" / "claude"])
    write_steps(steps, tmp_path / "steps.jsonl")
    (tmp_path / "teachers.toml").write_text('[[teachers]]\nname = "t"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "tiny"\n')
    (tmp_path / "bad.toml").write_text('[[teachers]\nname = "t"\n')
    (tmp_path / "no-url.toml").write_text('[[teachers]]\nname = "t"\nmodel = "tiny"\n')
    pair = {"id": "s:1", "prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}], "agree": ["t"], "circular": False}
    (tmp_path / "pairs.jsonl").write_text(json.dumps(pair) + "\n")
    for name, manifest in (("tasks", "{}"), ("bad-tasks", "{not json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(manifest)
    names = {"steps": "steps.jsonl", "teachers": "teachers.toml", "bad_toml": "bad.toml", "no_url": "no-url.toml",
             "pairs": "pairs.jsonl", "tasks": "tasks", "bad_tasks": "bad-tasks"}
    return {key: str(tmp_path / name) for key, name in names.items()}


@pytest.mark.parametrize("args, expected", ROWS, ids=[" ".join(a) for a, _ in ROWS])
def test_bad_input_to_a_tool_is_one_line_exit_2_and_writes_nothing(args, expected, tmp_path):
    subs = {**scaffold(tmp_path), **inputs(tmp_path)}
    made = listing(tmp_path)
    run_bad_input("composer_prime.entrypoints.cli", [fill(a, subs) for a in args], fill(expected, subs), timeout=300)
    assert listing(tmp_path) == made
    assert listing(tmp_path / "tasks") == ["manifest.json"]  # an --out given an existing directory left it alone
