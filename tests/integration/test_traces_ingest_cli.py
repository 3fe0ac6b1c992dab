"""`composer-prime traces ingest` as a command: our own recorded rollouts round-trip through it,
and bad input is one line that writes nothing."""

import asyncio
import sys
from pathlib import Path

from transformers import AutoTokenizer

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Completion
from composer_prime.env_runtime.tasksets import load_tasks
from composer_prime.orchestrator.rollouts import rollout
from composer_prime.orchestrator.traces import TraceLog
from composer_prime.traces.record import read_steps
from tests.conftest import ROOT
from tests.support import forkserver

FIXTURES = ROOT / "tests" / "fixtures" / "traces"


def read_and_ingest(src: Path, out: Path):
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", "ingest", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return read_steps(out)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    def cli(*argv):
        r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", "ingest", *argv],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        return r.stderr
    out = tmp_path / "steps.jsonl"
    assert "no such file or directory" in cli(str(tmp_path / "missing"), "--out", str(out))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.jsonl").write_text('{"hello": 1}\n')
    assert "no assistant steps found" in cli(str(tmp_path / "empty"), "--out", str(out))
    (tmp_path / "a-file").write_text("")
    assert "a-file is not a directory" in cli(str(FIXTURES / "openai"), "--out", str(tmp_path / "a-file" / "steps.jsonl"))
    assert not out.exists()


def test_our_recorded_rollouts_round_trip(tmp_path, tiny_model_dir):
    """A real tool-calc rollout (a scripted policy at the inference seam; the environment, tool
    session and scoring are real) written by the orchestrator's trace log, then ingested."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = load_tasks("tool-calc", {"num_tasks": 1})[0]  # "874 + 786"
    replies = ['<tool_call>{"name": "calc", "arguments": {"expr": "874 +"}}</tool_call>', "<tool_call>{oops",
               '<tool_call>{"name": "calc", "arguments": {"expr": "874 + 786"}}</tool_call>', "1660"]

    class Scripted:
        async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
            ids = tok.encode(replies.pop(0), add_special_tokens=False) + [tok.eos_token_id]
            return Completion(ids, [-0.5] * len(ids), "stop", 4)

    r = asyncio.run(rollout(Scripted(), tok, "tool-calc", task, SamplingParams(max_tokens=128), 1024, 8, 0, asyncio.Semaphore(1)))
    log = TraceLog(tmp_path / "traces.jsonl")
    log.write(7, [r])
    log.close()
    steps = read_and_ingest(tmp_path / "traces.jsonl", tmp_path / "steps.jsonl")
    assert [s.error for s in steps] == [True, True, False, None]  # a tool error, an unparseable call, a good call, the answer
    assert steps[0].meta == {"reward": 1.0, "env": "tool-calc", "policy_version": 4, "task_id": task.data.id}
    assert steps[-1].action["content"] == "1660" and steps[-1].messages[:2] == r.opening[:2]
    assert steps[2].action["tool_calls"][0]["function"] == {"name": "calc", "arguments": '{"expr": "874 + 786"}'}
    assert steps[0].tools == r.tools
