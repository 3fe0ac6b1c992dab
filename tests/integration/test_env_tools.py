"""`composer-prime env init | validate | eval`, run in-process (importing verifiers costs ~10 s a
process) through the real argument parser; eval runs against our real inference server."""

import asyncio
import importlib.util
import json

import pytest

from composer_prime.entrypoints.cli import parser
from tests.conftest import free_port
from tests.support import forkserver


def cli(*argv: str) -> int:
    args = parser().parse_args(["env", *argv])
    return args.func(args)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_init_then_validate_passes(tmp_path, capsys):
    assert cli("init", "scaffold-probe", "--dir", str(tmp_path)) == 0
    root = tmp_path / "scaffold-probe"
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == {
        "pyproject.toml", "README.md", "scaffold_probe/__init__.py", "scaffold_probe/taskset.py",
        "tests/test_scaffold_probe.py"}
    assert cli("validate", str(root), "-n", "5") == 0
    out = capsys.readouterr().out
    assert "OK: scaffold-probe: 5/5 tasks valid" in out and "1.000 ok" in out
    # the scaffold's own unit test passes too (validate put the package directory on sys.path)
    spec = importlib.util.spec_from_file_location("scaffold_probe_test", root / "tests" / "test_scaffold_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_gold_scores_one_and_empty_scores_zero()
    # refuses to overwrite, and refuses a bad name
    assert cli("init", "scaffold-probe", "--dir", str(tmp_path)) == 2
    assert "already exists" in one_line_error(capsys)
    assert cli("init", "Bad Name", "--dir", str(tmp_path)) == 2
    one_line_error(capsys)


def test_reverse_text_passes_validate(capsys):
    assert cli("validate", "reverse-text", "-n", "8", "--args", '{"split": "eval"}') == 0
    assert "OK: reverse-text: 8/8 tasks valid (gold via answer" in capsys.readouterr().out


def test_validate_fails_when_the_reward_ignores_the_answer(tmp_path, capsys):
    assert cli("init", "lazy-reward", "--dir", str(tmp_path)) == 0
    taskset = tmp_path / "lazy-reward" / "lazy_reward" / "taskset.py"
    src = taskset.read_text()
    taskset.write_text(src.replace("return word_accuracy(trace.last_reply, self.data.answer)", "return 0.5"))
    capsys.readouterr()
    assert cli("validate", str(tmp_path / "lazy-reward"), "-n", "3") == 1
    out = capsys.readouterr().out
    assert "FAILED: lazy-reward: 3/3 tasks invalid" in out
    assert "reward ignores the reply: gold and no-op both score 0.5" in out


def test_validate_uses_a_task_validate_hook_like_vf_validate(tmp_path, capsys):
    """A Task overriding `validate(runtime)` (vf-validate's gold check) is checked through it."""
    assert cli("init", "hooked-gold", "--dir", str(tmp_path)) == 0
    taskset = tmp_path / "hooked-gold" / "hooked_gold" / "taskset.py"
    taskset.write_text(taskset.read_text().replace(
        "    @vf.reward(weight=1.0)",
        "    async def validate(self, runtime) -> bool:\n"
        "        return self.data.answer.isupper()\n\n"
        "    @vf.reward(weight=1.0)", 1))
    capsys.readouterr()
    assert cli("validate", str(tmp_path / "hooked-gold"), "-n", "2") == 0
    out = capsys.readouterr().out
    assert "(validate)" in out and "gold via validate()" in out


def test_validate_bad_input_is_one_line(capsys):
    assert cli("validate", "no-such-env-xyz") == 2
    assert "not installed" in one_line_error(capsys)
    assert cli("validate", "reverse-text", "--args", "{not json") == 2
    one_line_error(capsys)
    assert cli("validate", "reverse-text", "--args", '{"no_such_field": 1}') == 2
    one_line_error(capsys)


@pytest.fixture(scope="module")
def inference(hf_inference):
    return hf_inference


def test_eval_against_our_inference_server(inference, tmp_path, capsys):
    from composer_prime.hub.loading import load_env
    from composer_prime.env_runtime.tasksets import score

    out = tmp_path / "results.jsonl"
    assert cli("eval", "reverse-text", "--url", inference, "--model", "tiny", "-n", "6", "--max-tokens", "16",
               "--temperature", "1.0", "--args", '{"split": "eval"}', "--out", str(out)) == 0
    line = capsys.readouterr().out
    mean = float(line.split("mean reward ")[1].split()[0])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 6 and 0.0 <= mean <= 1.0
    assert mean == pytest.approx(sum(r["reward"] for r in rows) / 6, abs=1e-4)
    # each row's reward is the Task's own score of the reply the server returned
    _, tasks = load_env("reverse-text", {"split": "eval"}, 6)
    for row, task in zip(rows, tasks):
        assert row["prompt"][-1]["content"] == task.data.prompt and row["completion_tokens"] > 0
        assert row["reward"] == asyncio.run(score(task, row["reply"]))[0]


def test_eval_unreachable_server_is_one_line(capsys):
    assert cli("eval", "reverse-text", "--url", f"http://127.0.0.1:{free_port()}", "--model", "m", "-n", "1") == 2
    assert "unreachable" in one_line_error(capsys)


def test_eval_runs_tool_conversations(tmp_path, capsys):
    """tool-calc against a scripted OpenAI stub: call calc with the question, then repeat its result."""
    from aiohttp import web

    async def chat(request):
        body = await request.json()
        last = body["messages"][-1]
        if last["role"] == "tool":
            text = last["content"]
        else:
            text = '<tool_call>{"name": "calc", "arguments": {"expr": "%s"}}</tool_call>' % last["content"]
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": text},
                                               "finish_reason": "stop"}], "usage": {"completion_tokens": 3}})

    async def serve_and_eval() -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await asyncio.to_thread(cli, "eval", "tool-calc", "--url", f"http://127.0.0.1:{port}", "--model", "stub",
                                           "-n", "3", "--out", str(tmp_path / "calc.jsonl"))
        finally:
            await runner.cleanup()

    assert asyncio.run(serve_and_eval()) == 0
    assert "mean reward 1.0000 over 3 tasks" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "calc.jsonl").read_text().splitlines()]
    for row in rows:
        assert [t["tool_call"] for t in row["turns"]] == ["calc", None]
        assert row["metrics"]["calc_ok"] == 1.0 and row["completion_tokens"] == 6


def test_tool_calc_passes_validate(capsys):
    assert cli("validate", "tool-calc", "-n", "4") == 0
    assert "OK: tool-calc: 4/4 tasks valid" in capsys.readouterr().out


def test_a_scaffold_as_generated_validates_and_trains_two_rl_steps(tmp_path):
    """The user's path: `env init`, `env validate`, then `rl` on it (installed here by putting its
    directory on PYTHONPATH, as `uv pip install -e` would make it importable)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    def run(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "fresh-env")}
        r = forkserver.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, (argv[:3], r.stdout[-3000:], r.stderr[-3000:])
        return r

    run("composer_prime.entrypoints.cli", "env", "init", "fresh-env", "--dir", str(tmp_path))
    assert "OK: fresh-env: 20/20 tasks valid" in run("composer_prime.entrypoints.cli", "env", "validate",
                                                     str(tmp_path / "fresh-env")).stdout
    out = tmp_path / "run"
    run("composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "--orchestrator.envs", '[{id="fresh-env"}]',
        "--output_dir", str(out), "--max_steps", "2", "--inference.port", str(free_port()), "--transport.address",
        f"tcp://127.0.0.1:{free_port()}", "--orchestrator.batch_size", "16", "--orchestrator.group_size", "4",
        "--orchestrator.eval.num_tasks", "4", "--orchestrator.dynamic_sampling", "false", timeout=900)
    orch = [json.loads(ln) for ln in (out / "orchestrator" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in orch if "rollouts" in r] == [0, 1] and "eval/fresh-env/reward" in orch[0]
    trainer = [json.loads(ln) for ln in (out / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trainer] == [0, 1] and all(t["trained_tokens"] > 0 for t in trainer)
