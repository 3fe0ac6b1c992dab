"""`composer-prime traces ingest` on OpenEnv capture exports as a command: the committed fixtures
(tests/fixtures/openenv_traces/) are exactly what OpenEnv's own capture code exports for the
rollouts of tests/support/openenv_capture.py, and the command turns them into the exact steps.
A malformed export is one of test_bad_input_tools' rows (one line, exit 2, nothing written)."""

import json
import sys

from composer_prime.traces.record import read_steps
from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.openenv_capture import trace_entries_answer, training_trace

FIXTURES = ROOT / "tests" / "fixtures" / "openenv_traces"


def test_the_fixtures_are_what_openenv_exports():
    assert json.loads((FIXTURES / "good" / "rollout.json").read_text()) == training_trace()
    lines = (FIXTURES / "good" / "entries.jsonl").read_text().splitlines()
    assert [json.loads(ln) for ln in lines] == [trace_entries_answer("rollout-2"), trace_entries_answer("rollout-3")]
    spoilt = training_trace()
    spoilt["turns"][1]["loss_mask"].pop()  # one short of prompt + completion
    assert json.loads((FIXTURES / "malformed" / "short-mask.json").read_text()) == spoilt


def test_ingest_command_reads_both_export_shapes(tmp_path):
    out = tmp_path / "steps.jsonl"
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", "ingest", str(FIXTURES / "good"),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"6 steps from 2 files -> {out}"
    steps = read_steps(out)
    assert [s.id for s in steps] == ["entries.jsonl:1:0", "entries.jsonl:1:1", "entries.jsonl:2:0", "entries.jsonl:2:1",
                                     "rollout.json:1:0", "rollout.json:1:1"]
    assert [s.meta.get("session") for s in steps] == ["rollout-2", "rollout-2", "rollout-3", "rollout-3", None, None]
    assert [s.action["content"] for s in steps] == ["", "408"] * 3
