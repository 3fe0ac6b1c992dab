"""OpenEnv environments that fail, with real servers: a server killed mid-episode, a session refused
at capacity, a step that outlasts its timeout, an observation its own schema rejects. Each time
the rollout is dropped and counted by reason (`dropped/<reason>`), the step goes on with the
others, and a server the orchestrator started is started again. A missing package or a URL that
does not answer is one line and exit 2 at `--dry-run` and at start.

The orchestrator is the real one (its environments, servers, collect and build); the policy is a
scripted client at the inference seam, so each test knows exactly what the model does.
"""

import asyncio
import signal
import subprocess
import sys

import pytest

from composer_prime.config import OrchestratorConfig
from composer_prime.contract.inference import Completion
from composer_prime.env_runtime.episode import FAULTS
from composer_prime.orchestrator.orchestrator import Orchestrator
from tests.conftest import ROOT, free_port, start_until_ready
from tests.support import forkserver


def orchestrator(model, out, env: dict, batch_size: int = 4) -> Orchestrator:
    return Orchestrator(OrchestratorConfig.model_validate({
        "model": str(model), "output_dir": str(out), "batch_size": batch_size, "group_size": 2, "seq_len": 512,
        "dynamic_sampling": False, "eval": {"num_tasks": 1}, "sampling": {"max_tokens": 64},
        "envs": [{"kind": "openenv", "max_turns": 2, **env}]}))


class Policy:
    """Every turn the same reply from policy version 0, after `delay` s. With `before`, the first
    `gather` turns wait for each other, then `before` runs once: every episode of the step is open."""

    def __init__(self, tok, reply: str, delay: float = 0.0, before=None, gather: int = 1) -> None:
        self.ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
        self.delay, self.before, self.gather, self.turns = delay, before, gather, 0
        self.all_in = asyncio.Event()

    async def generate(self, prompt_ids, params) -> Completion:
        self.turns += 1
        if self.turns <= self.gather and self.before is not None:
            if self.turns == self.gather:
                self.before()
                self.all_in.set()
            await self.all_in.wait()
        await asyncio.sleep(self.delay)
        return Completion(self.ids, [-0.5] * len(self.ids), "stop", 0)


def steps(o: Orchestrator, policy, n: int = 1) -> list[dict]:
    """`n` steps of collect and build, the environments started before and closed after."""
    async def run() -> list[dict]:
        o.client, infos = policy, []
        for env in o.envs:
            await env.env.start()
        try:
            for step in range(n):
                infos.append((await o.build(step, await o.collect(step)))[1])
        finally:
            for env in o.envs:
                await env.env.close()
        return infos
    return asyncio.run(run())


def dropped(info: dict) -> dict:
    return {k: info[f"dropped/{k}"] for k in FAULTS if info[f"dropped/{k}"]}


CALC = '<tool_call>{"name": "calc", "arguments": {"expr": "12 * 34"}}</tool_call>'


def test_a_server_killed_mid_episode_drops_its_rollouts_and_is_started_again(tiny_model_dir, tmp_path):
    o = orchestrator(tiny_model_dir, tmp_path, {"id": "openenv-calc", "sessions": 4})
    servers = o.envs[0].env.servers
    killed: list[int] = []

    def kill() -> None:  # once the 4 episodes of the step are open on the server, at their first turns
        killed.append(servers.servers[0].proc.pid)
        servers.servers[0].proc.send_signal(signal.SIGKILL)

    policy = Policy(o.tok, CALC, before=kill, gather=4)
    [info] = steps(o, policy)
    # the 4 episodes open on it dropped; the step drew 2 groups again, on the server started again
    assert dropped(info) == {"server_died": 4} and info["env/openenv-calc/dropped"] == 4 and info["groups"] == 4
    assert info["env/openenv-calc/server_restarts"] == 1 and info["rollouts"] == 4 and info["empty_batch"] == 0
    assert info["env/openenv-calc/tool_calls"] == 2.0  # two calc calls each (the turn limit): the new episodes ran
    assert policy.turns == 4 + 4 * 2  # one turn of each dropped episode, two of each kept one
    assert servers.servers[0].proc.pid != killed[0] and servers.servers[0].proc.poll() is not None  # stopped at close


def test_a_session_refused_at_capacity_is_dropped(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENENV_CALC_SESSIONS", "1")  # the server started holds one session; the config says two
    o = orchestrator(tiny_model_dir, tmp_path, {"id": "openenv-calc", "sessions": 2}, batch_size=2)
    [info] = steps(o, Policy(o.tok, "7", delay=0.5))  # the first episode stays open while the second connects
    assert dropped(info) == {"capacity": 1} and info["rollouts"] == 1
    assert info["env/openenv-calc/server_restarts"] == 0


@pytest.fixture(scope="module")
def faulty():
    import httpx

    port = free_port()
    proc = start_until_ready([sys.executable, "-m", "uvicorn", "tests.support.openenv_faulty:app", "--host", "127.0.0.1",
                              "--port", str(port), "--log-level", "critical"],  # not the stalled steps' late replies
                             lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


# step_timeout_s: the stalled case waits it out 8 times, so half a second there (any call it cuts is a timeout all
# the same); the schema case's calls must all answer within it: a second, as before
@pytest.mark.parametrize("reply,reason,step_timeout_s", [
    ('<tool_call>{"name": "slow", "arguments": {"seconds": 5}}</tool_call>', "timeout", 0.5),
    ('<tool_call>{"name": "odd", "arguments": {}}</tool_call>', "schema", 1.0),
])
def test_a_stalled_step_or_an_observation_off_schema_is_dropped(tiny_model_dir, tmp_path, faulty, reply, reason,
                                                                step_timeout_s):
    o = orchestrator(tiny_model_dir, tmp_path, {"id": "faulty", "url": faulty, "sessions": 2,
                                                "step_timeout_s": step_timeout_s}, batch_size=2)
    [info] = steps(o, Policy(o.tok, reply))
    # every episode fails at its first call; the step draws its group again, 8 times at most, and goes on empty
    assert dropped(info) == {reason: 2 * 8} and info["groups"] == 8 and info["rollouts"] == 0 and info["empty_batch"] == 1


def one_line(cmd: list[str]) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("env,message,runs", [
    ({"id": "openenv-nosuch"}, "orchestrator.envs[0]: OpenEnv environment 'openenv-nosuch' is not installed: "
                               "no module openenv_nosuch.server.app", (["--dry-run"], "orchestrator")),
    ({"id": "remote", "url": "http://127.0.0.1:{port}"}, "orchestrator.envs[0]: http://127.0.0.1:{port} does not answer "
                                                        "/health as an OpenEnv server: ConnectError", (["--dry-run"], [])),
])
def test_a_missing_package_or_a_silent_url_is_one_line_at_dry_run_and_at_start(tmp_path, env, message, runs):
    """`rl --dry-run`, and `rl` itself or the orchestrator started on its own (each case one of
    them: the check is the same function, env_runtime/envs.py check_envs)."""
    port = free_port()  # nothing listens there
    env, message = {k: v.format(port=port) for k, v in env.items()}, message.format(port=port)
    toml = tmp_path / "run.toml"
    toml.write_text('model = "tiny"\n[[orchestrator.envs]]\nkind = "openenv"\n' + "".join(f'{k} = "{v}"\n' for k, v in env.items()))
    for run in runs:
        if run == "orchestrator":
            orch = tmp_path / "orchestrator.toml"
            orch.write_text(f'output_dir = "{tmp_path / "orch"}"\n' + toml.read_text().replace('model = "tiny"\n', "")
                            .replace("[[orchestrator.envs]]", "[[envs]]"))
            r = one_line(["composer_prime.entrypoints.orchestrator", "@", str(orch)])
            assert (r.returncode, r.stderr.count("\n")) == (2, 1) and r.stderr.startswith(f"error: {message}"), r.stderr
            continue
        r = one_line(["composer_prime.entrypoints.rl", "@", str(toml), "--output_dir", str(tmp_path / "run"),
                      "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}", *run])
        assert (r.returncode, r.stdout, r.stderr.count("\n")) == (2, "", 1), r.stderr
        assert r.stderr.startswith(f"config error: {message}") and r.stderr.endswith(f" ({toml})\n"), r.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "orch").exists()  # nothing written, nothing started
