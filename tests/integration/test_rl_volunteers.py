"""`rl` with volunteers (issue 27): the quickstart with the pool and SHARDCAST (configs/volunteers.toml),
two honest `uv run worker` processes and one dishonest worker (its weights 1% off the run's) that
join it at run time. Reward rises; the honest workers' completions are validated and trained
on, they are never ejected; the dishonest one is ejected at its second rejection, its process
stops with one line, and not one rollout it sampled a turn of reaches a batch."""

import subprocess
import sys
import time

from composer_prime.contract.volunteer import node_id
from composer_prime.volunteer.keys import load_or_make
from tests.conftest import ROOT, free_port
from tests.support.rl_runs import log_tails, rows

STEPS = 50


def test_rl_with_two_volunteers_and_a_cheat(tmp_path):
    run, pool_port = tmp_path / "run", free_port()
    rl = subprocess.Popen(
        [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "@", "configs/volunteers.toml",
         "--output_dir", str(run), "--max_steps", str(STEPS), "--inference.port", str(free_port()),
         "--weight_broadcast.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
         "--orchestrator.volunteers.port", str(pool_port), "--orchestrator.eval.interval", "100",
         "--orchestrator.eval.num_tasks", "96"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    token = run / "orchestrator" / "volunteers.token"
    deadline = time.time() + 300
    while not token.exists():
        assert rl.poll() is None and time.time() < deadline, log_tails(run)
        time.sleep(0.5)
    keys = {name: load_or_make(tmp_path / f"{name}.key") for name in ("honest0", "honest1", "cheat")}
    ids = {name: node_id(k)[:12] for name, k in keys.items()}

    def flags(name: str) -> list[str]:
        return ["--join", f"http://127.0.0.1:{pool_port}", "--token_file", str(token), "--key_path", str(tmp_path / f"{name}.key"),
                "--work_dir", str(tmp_path / name), "--device", "cpu", "--concurrency", "4"]  # dtype: the run's
    workers = {name: subprocess.Popen([sys.executable, "-m", "composer_prime.entrypoints.worker", *flags(name)], cwd=ROOT,
                                      stderr=subprocess.PIPE, text=True) for name in ("honest0", "honest1")}
    workers["cheat"] = subprocess.Popen([sys.executable, "-m", "tests.support.dishonest_worker", "OtherWeights", *flags("cheat")],
                                        cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert rl.wait(timeout=1500) == 0, log_tails(run)
        cheat_rc, cheat_err = workers["cheat"].wait(timeout=60), workers["cheat"].stderr.read()
    finally:
        for p in workers.values():
            p.kill()
            p.wait()

    assert cheat_rc == 2 and cheat_err.strip().splitlines()[-1].startswith("error: ejected by the run"), cheat_err[-2000:]
    steps = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "reward" in r]
    last = steps[-1]
    assert last["volunteers/ejected"] == 1 and last["volunteers/healthy"] == 2
    for name in ("honest0", "honest1"):  # validated, trained on, never rejected
        assert last[f"volunteers/{ids[name]}/accepted"] > 20, {k: v for k, v in last.items() if "volunteers" in k}
        assert not any(k.startswith(f"volunteers/{ids[name]}/rejected") for k in last)
        assert sum(r.get(f"volunteers/{ids[name]}/in_batch", 0) for r in steps) > 20
    cheat = {k.split("/")[-1]: v for k, v in last.items() if k.startswith(f"volunteers/{ids['cheat']}/")}
    assert sum(v for k, v in cheat.items() if k.startswith("rejected:")) == 2 and cheat.get("accepted", 0) == 0, cheat
    assert all(r.get(f"volunteers/{ids['cheat']}/in_batch", 0) == 0 for r in steps)  # none of its rollouts trained on
    assert sum(r["unverified"] for r in steps) >= 2  # its rejected rollouts, dropped by the filter

    evals = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "eval_reward" in r]
    assert evals[-1]["eval_version"] == STEPS and evals[-1]["eval_reward"] > evals[0]["eval_reward"] + 0.03, evals
