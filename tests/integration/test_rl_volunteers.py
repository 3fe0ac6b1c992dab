"""`rl` with volunteers (issue 27): the quickstart with the pool and SHARDCAST (configs/volunteers.toml),
two honest `uv run worker` processes and one dishonest worker (its weights 1% off the run's) that
join it at run time, the run waiting for all three before its first step (`volunteers.wait_for`; the
session's `relay_run`, tests/support/shared_runs.py). Reward rises; the
honest workers' completions are validated, reach the trainer with log-probs it agrees with, and are
trained on; they are never ejected; the dishonest one is ejected at its second rejection, its process
stops with one line, its invite is revoked, and not one rollout it sampled a turn of reaches a batch.

The same run's weights through SHARDCAST: trainer origin -> one relay -> two inference servers (this
file's second test, once test_rl_shardcast.py: one file, so the run is made once, by the first test)."""

import json
import sys
import tomllib

from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.rl_runs import rows
from tests.support.shared_runs import RELAY_STEPS, RelayRun

# Measured on this run at seeds 0, 1 and 2 (2026-11-28, 2-core CPU, load 12 to 17, three runs at once; the volunteers
# waited for, in all 50 steps): held-out +0.052, +0.087, +0.070 (0.507 at v0 at every seed: fixed tasks and seeds, so
# weights that do not move score exactly that again), where with the volunteers joining 5 to 16 steps in it rose
# +0.080, +0.090, +0.070 (2026-11-27) against a RISE of 0.05, now 0.04 for seed 0's +0.052. (50 steps of 64 rollouts
# rose +0.044, +0.041, +0.046 three at once and +0.022 at seed 0 alone: too little to tell, so the run keeps the
# quickstart's 128.) mismatch_kl median 7.9e-4, 5.7e-4, 5.7e-4 and at most 0.078, 2.1e-3, 9.7e-3 over the steps with
# volunteers' rollouts, all 50 at each seed (2026-11-27, joining late: at most 8.1e-4, 1.6e-3, 6.0e-3; median 7.8e-4).
# The batch's mismatch_kl also carries the async window's lag (one policy step, max_async_level = 1), which spikes now
# and then whoever sampled: 0.032 on a step without volunteers, 0.110 on one step of 30 with them in CI's run of
# 9a77c39 (its other steps 5e-4 to 2e-3). So the bound is on the median over the steps with volunteers: log-probs lost
# on the way (zeros) add exp(-lp) - 1 + lp on every volunteer token, every step. A bug on fewer than half of those
# steps passes the median, so every step has a loose bound too (issue 42): well above the lag's spikes (0.110; 0.078
# at seed 0 above), well below what zeroed log-probs add. The tiny model's own draws on this task (1,395 tokens of 256
# rollouts, 16 tokens at most, 2026-11-27): a zeroed log-prob adds 46 nats of k3 per token on average (median 0.07: a
# few unlikely tokens add hundreds), so a step of 128 rollouts with one group of 8 zeroed reads over 1.0 in 85% of
# 2,000 resampled steps (median 2.4), with 16 zeroed in 99.6%.
RISE = 0.04
MEDIAN_MISMATCH_KL = 0.01
STEP_MISMATCH_KL = 1.0


# Not `alone` (it was: workers starting on a loaded machine had joined after the run ended, seed 2, load 10): the
# run waits for its three volunteers before its first step (they took 180 s to join at load 18, 2026-11-28).
def test_rl_with_two_volunteers_and_a_cheat(relay_run: RelayRun):
    run, ids = relay_run.run, relay_run.ids
    assert relay_run.cheat_rc == 2 and relay_run.cheat_err.strip().splitlines()[-1].startswith("error: ejected by the run"), \
        relay_run.cheat_err[-2000:]
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
    # Waited for, it is rejected in the first held-out evaluation (whose requests come first): its rejected rollouts
    # in a batch, dropped by the `unverified` filter, are test_filters.py's (they were here when it joined mid-run).
    # each joined with an invite of its own (the README's command); the cheat's ejection revoked its invite
    listed = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "volunteers", "list", "--run", str(run)],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    state = {line.split("\t")[0]: line.split("\t")[2] for line in listed.splitlines()}
    assert state["honest0"] == state["honest1"] == "active", listed
    assert state["cheat"].startswith(f"revoked: node {ids['cheat']} ejected: 2 strikes"), listed

    # The honest volunteers' log-probs are the trainer's: at every step where their rollouts made up part of
    # the batch, the trainer's k3 estimate of KL(trainer || sampler) stays at a float32 recomputation's size.
    trainer = {r["step"]: r for r in rows(run / "trainer" / "metrics.jsonl")}
    with_volunteers = [r["step"] for r in steps if any(r.get(f"volunteers/{ids[n]}/in_batch", 0) for n in ("honest0", "honest1"))]
    # waited for, they are in the first step's batch: in all 50 steps' at seeds 0, 1 and 2
    assert with_volunteers[:1] == [0] and len(with_volunteers) > RELAY_STEPS // 2, with_volunteers
    kls = sorted(trainer[s]["mismatch_kl"] for s in with_volunteers)
    assert kls[len(kls) // 2] < MEDIAN_MISMATCH_KL, {s: trainer[s]["mismatch_kl"] for s in with_volunteers}
    assert kls[-1] < STEP_MISMATCH_KL, {s: trainer[s]["mismatch_kl"] for s in with_volunteers}  # on every step

    evals = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "eval_reward" in r]
    assert evals[-1]["eval_version"] == len(steps) and evals[-1]["eval_reward"] > evals[0]["eval_reward"] + RISE, evals


# The test above made the run (a file's tests run in order on one worker); this one only reads it.
def test_rl_learns_with_weights_through_a_relay_to_two_inference_servers(relay_run: RelayRun):
    run = relay_run.run
    configs = {p.stem: tomllib.loads(p.read_text()) for p in (run / "configs").glob("*.toml")}
    assert sorted(configs) == ["inference-0", "inference-1", "orchestrator", "relay-0", "trainer"]
    relay_url = f"http://127.0.0.1:{configs['relay-0']['port']}"
    for name in ("inference-0", "inference-1"):
        wb = configs[name]["weight_broadcast"]
        assert wb["type"] == "shardcast" and wb["servers"] == [relay_url] and wb["public_key"] == str(run / "keys" / "trainer.ed25519.pub")
        stats = json.loads((run / f"inference-{configs[name]['port']}" / "stats.json").read_text())
        assert stats["loaded_step"] == RELAY_STEPS and stats["refused_steps"] == 0, stats  # the last step reached both servers
    assert configs["relay-0"]["upstream"] == [f"http://127.0.0.1:{relay_run.origin_port}"]
    assert (run / "keys" / "trainer.ed25519").stat().st_mode & 0o777 == 0o600  # made by rl at launch
    assert len((run / "keys" / "trainer.ed25519.pub").read_text().strip()) == 64
    mirrored = (run / "relay-0" / "distribution.txt").read_text().splitlines()
    assert mirrored and mirrored[-1].split(":")[0] == f"v{RELAY_STEPS}", mirrored  # the relay served the last step

    trainer = rows(run / "trainer" / "metrics.jsonl")
    assert [t["step"] for t in trainer] == list(range(RELAY_STEPS))
    evals = [x for x in rows(run / "orchestrator" / "metrics.jsonl") if "eval_reward" in x]
    assert evals[0]["eval_version"] == 0 and evals[-1]["eval_version"] == RELAY_STEPS  # learning: the test above
    # Retention follows the async window: the origin lists only the last keep_last steps.
    listed = (run / "shardcast" / "distribution.txt").read_text().splitlines()
    assert [ln.split(":")[0] for ln in listed] == [f"v{s}" for s in range(RELAY_STEPS - 2, RELAY_STEPS + 1)]
