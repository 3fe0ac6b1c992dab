"""Every process on its own machine: five emulated hosts (network namespaces on one switch,
benchmarks/support/netem.py), each with its own address and its own loopback, running inference,
the orchestrator, a trainer on two nodes (`trainer.nodes`: FSDP2 over gloo between the two hosts,
meeting at the first's rendezvous) and a SHARDCAST relay, started alone from the configs `rl --dry-run`
writes as docs/running.md "On several machines" says; a run directory per host, nothing shared but
the keys and the trainer's output_dir (its two nodes', as a cluster's shared filesystem). At the end
inference serves the trainer's last step exactly: a seeded probe's log-probs are those the trainer's
final checkpoint gives its tokens, and not the step before's. (Learning with weights through a SHARDCAST
relay is test_rl_volunteers.py's, on the session's relay_run; two ranks computing one process's step,
on two hosts too, test_fsdp.py's: this run no longer repeats 50 steps for a held-out rise.)
Needs root (network namespaces); skipped without.

Batches travel over CURVE-encrypted ZMQ (bound on the trainer's address), weights from the trainer's
SHARDCAST origin to the relay and from the relay to inference (its only server), and inference's
/update_weights refuses a request without the token. The kernel's TCP tables of every host, read
throughout (tests/support/host_sockets.py), must show each service reached on its host's address and
nothing listening on or reaching for loopback for another host's service; a process that looked for
a peer on 127.0.0.1 would also find its own host's loopback empty, and the run would not advance.

The faults a network brings, in the same run: the relay's host is cut off the switch for 6 s (past SHARDCAST's 5 s to connect)
(inference keeps serving its last verified step and catches up once it is back), the trainer's
whole process group is killed as when its machine dies and restarted with --resume (it tells the
orchestrator the step it expects; every step is trained exactly once; both nodes, as a job is requeued), and later inference's host
is cut for longer than the orchestrator's request timeout (`inference_timeout_s`): the orchestrator
stops with one line naming that host, and started again once the host is back it finishes the run.
Metrics also go to offline W&B runs."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from benchmarks.support import netem
from composer_prime.trainer.model import load_model
from tests.conftest import ROOT
from tests.support import forkserver, host_sockets
from tests.support.rl_runs import log_tails, probe, probe_ids, rl_args, rows
from tests.support.wandb_records import history, runs

# 16 steps of 4 groups of 8 (it was 50 of 16 groups, for a held-out rise): the trainer is killed near step 4-8
# (the relay's cut holds it there: max_async_level 1), inference's host cut at CUT_AT, a few steps left after
STEPS = 16
BATCH = 32
HOSTS = ["inference", "orchestrator", "trainer", "trainer2", "relay"]
PORTS = {"inference": 8000, "batches": 5557, "origin": 8100, "relay": 8200, "rendezvous": 29500}  # each host its own
SERVICES = {("inference", 8000): "inference", ("trainer", 5557): "batches", ("trainer", 8100): "origin", ("relay", 8200): "relay",
            ("trainer", 29500): "rendezvous"}
# who must have reached which service on its host's address
EDGES = {("orchestrator", "inference"), ("orchestrator", "batches"), ("relay", "origin"), ("inference", "relay"),
         ("trainer2", "rendezvous")}
CUT_AT = 10  # trainer steps done when inference's host is cut (at least 2 past the restart)
RELAY_CUT_S = 6
# a served log-prob against the same weights' in one forward pass, both float32 on the CPU: within 1e-4 in the run
# that set it (2-core CPU, load 26, 2026-11-28), its step 14's more than 1e-3 off; checkpoints two steps apart give
# 12-token answers log-probs 0.08 to 0.10 apart (steps 48 and 50 of a 50-step run, three answers)
SAME = 1e-4
TIMEOUT_S = 5.0  # the orchestrator's inference_timeout_s; quickstart generations take well under a second


def health(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/health", timeout=10).json()  # a loaded machine's server answers slowly
    except httpx.HTTPError:
        return None


def scored(ckpt: Path, model_dir: Path, tokens: list[int], tmp: Path) -> list[float]:
    """The log-probs a trainer checkpoint's model gives `probe`'s answer `tokens` (temperature 1, float32)."""
    saved = tmp / f"{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(saved))
    model = load_model(str(model_dir))
    model.load_state_dict(torch.load(saved, weights_only=False)["model"])
    ids = probe_ids(model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def serving(url: str) -> int:
    """The weight version inference serves; it must answer."""
    answer = health(url)
    assert answer is not None, f"inference at {url} did not answer /health"
    return answer["weight_version"]


def test_listening_on_or_reaching_for_loopback_is_a_breach():
    """What the run's check reads, made up: each breach it must name, and a clean table that passes."""
    S = host_sockets.Sock
    addr, op = {"inference": "10.0.0.1", "orchestrator": "10.0.0.2"}, "10.0.0.254"
    services = {("inference", 8000): "inference"}
    clean = {"inference": {S(("10.0.0.1", 8000), ("0.0.0.0", 0), "0A"), S(("10.0.0.1", 8000), ("10.0.0.2", 40000), "01"),
                           S(("10.0.0.1", 8000), (op, 50000), "01")},  # the test itself asking inference
             "orchestrator": {S(("10.0.0.2", 40000), ("10.0.0.1", 8000), "01"), S(("127.0.0.1", 5000), ("127.0.0.1", 41000), "01")}}
    assert host_sockets.judge(clean, addr, services, op) == ({("orchestrator", "inference")}, [])
    bad = {"inference": {S(("127.0.0.1", 8000), ("0.0.0.0", 0), "0A")},
           "orchestrator": {S(("127.0.0.1", 40000), ("127.0.0.1", 8000), "02"), S(("10.0.0.2", 1), ("192.0.2.9", 80), "01"),
                            S(("10.0.0.2", 2), (op, 22), "01")}}
    edges, breaches = host_sockets.judge(bad, addr, services, op)
    assert not edges and sorted(breaches) == [
        "inference's inference listens on 127.0.0.1:8000, unreachable from other hosts",
        "orchestrator reaches for inference (inference's port) at 127.0.0.1:8000",
        "orchestrator talks to 10.0.0.254:22, the test's own address",
        "orchestrator talks to 192.0.2.9:80, no host of this run"]
    assert host_sockets.parse("sl local rem st\n 0: 0100007F:1F40 0200000A:9C40 01 x\n") == {S(("127.0.0.1", 8000), ("10.0.0.2", 40000), "01")}


@pytest.mark.skipif(netem.available() is not None, reason=f"network namespaces: {netem.available()}")
def test_five_hosts_serve_the_trainers_steps_through_a_relay_cut_and_a_trainer_crash_on_two_nodes(tmp_path, tiny_model_dir):
    with netem.switched(HOSTS) as net:
        run_hosts(net, tmp_path, tiny_model_dir)


def run_hosts(net: netem.Hosts, tmp_path, tiny_model_dir) -> None:
    plan, logs = tmp_path / "plan", tmp_path / "logs"
    logs.mkdir()
    a = net.addr
    url = f"http://{a['inference']}:{PORTS['inference']}"
    py = sys.executable
    dry = forkserver.run([py, "-m", "composer_prime.entrypoints.rl", *rl_args(plan, "--max_steps", str(STEPS), "--trainer.ckpt.interval", "2"),
                          "--orchestrator.batch_size", str(BATCH),
                          "--inference.host", a["inference"], "--inference.port", str(PORTS["inference"]),
                          "--orchestrator.inference_urls", json.dumps([url]), "--trainer.inference_urls", json.dumps([url]),
                          "--orchestrator.inference_timeout_s", str(TIMEOUT_S),
                          "--transport.address", f"tcp://{a['trainer']}:{PORTS['batches']}",
                          "--weight_broadcast.type", "shardcast", "--weight_broadcast.host", a["trainer"],
                          "--weight_broadcast.port", str(PORTS["origin"]), "--wandb.mode", "offline",
                          "--trainer.nodes.count", "2", "--trainer.nodes.master", f"{a['trainer']}:{PORTS['rendezvous']}",
                          "--trainer.nodes.trusted_network", "true", "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    keys = subprocess.run([py, "-m", "composer_prime.entrypoints.cli", "keys", "make", "--out", str(plan / "keys")],
                          cwd=ROOT, capture_output=True, text=True)
    assert keys.returncode == 0, keys.stderr  # the directory the plan named; copied to each machine in real life
    relay = f"http://{a['relay']}:{PORTS['relay']}"
    args = {"inference": ["--weight_broadcast.servers", json.dumps([relay])], "orchestrator": [],
            "trainer": ["--nodes.host", a["trainer"]], "trainer2": ["--nodes.rank", "1", "--nodes.host", a["trainer2"]]}
    out = {**{h: tmp_path / h for h in HOSTS}, "trainer2": tmp_path / "trainer"}  # the trainer's nodes share one
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(name: str, *extra: str) -> subprocess.Popen:
        if name == "relay":
            cmd = ["-m", "composer_prime.entrypoints.relay", "--upstream", f"http://{a['trainer']}:{PORTS['origin']}",
                   "--public_key", str(plan / "keys" / "trainer.ed25519.pub"), "--host", a["relay"],
                   "--port", str(PORTS["relay"]), "--data_dir", str(tmp_path / "relay"), "--poll_wait_s", "5"]
        else:
            process = name.rstrip("2")
            cmd = ["-m", f"composer_prime.entrypoints.{process}", "@", str(plan / "configs" / f"{process}.toml"),
                   "--output_dir", str(out[name]), *args[name], *extra]
        with (logs / f"{name}.log").open("a") as log:
            return subprocess.Popen([*net.prefix[name], py, *cmd], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    procs = {name: start(name) for name in ("inference", "relay")}
    metrics = tmp_path / "trainer" / "trainer" / "metrics.jsonl"
    seen: dict[str, set[host_sockets.Sock]] = {h: set() for h in HOSTS}
    done = threading.Event()

    def watch() -> None:  # every host's TCP table, as often as it changes
        while not done.is_set():
            for h, p in list(procs.items()):
                seen[h] |= host_sockets.read(p.pid)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        deadline = time.time() + 240
        while health(url) is None:
            assert time.time() < deadline and procs["inference"].poll() is None, log_tails(tmp_path)
            time.sleep(0.5)
        before = probe(url, tiny_model_dir)  # the weights the run starts from, answering one seeded request
        # its control route beyond loopback wants the run's token (the trainer's, with filesystem broadcast)
        assert httpx.post(f"{url}/update_weights", json={"path": "/nonexistent", "version": 1}).status_code == 401
        procs |= {name: start(name) for name in ("trainer", "trainer2", "orchestrator")}
        deadline = time.time() + 600
        while len(rows(metrics)) < 4 and time.time() < deadline and all(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
        assert len(rows(metrics)) >= 4, log_tails(tmp_path)

        # The relay's host cut off: inference keeps serving the last step it verified, then catches up.
        net.cut("relay")
        held, cut_until = set(), time.time() + RELAY_CUT_S
        while time.time() < cut_until:
            held.add(serving(url))
            time.sleep(0.5)
        assert len(held) <= 2, held  # at most one step landed as the cable was pulled
        published = len(rows(metrics))  # the trainer went on a step or so past what inference serves
        served = probe(url, tiny_model_dir)
        net.mend("relay")
        deadline = time.time() + 120
        while serving(url) <= max(held):
            assert time.time() < deadline, log_tails(tmp_path)
            time.sleep(0.2)
        caught_up = time.time() - cut_until

        launchers = [psutil.Process(procs[n].pid) for n in ("trainer", "trainer2")]
        tree = [q for p in launchers for q in (p, *p.children(recursive=True))]  # torchrun and its ranks, on both nodes
        for p in tree:  # the machines are gone
            p.kill()
        procs["trainer"].wait()
        procs["trainer2"].wait()
        psutil.wait_procs(tree, timeout=30)
        done_before = len(rows(metrics))
        time.sleep(2)
        procs |= {name: start(name, "--resume") for name in ("trainer2", "trainer")}  # in either order: they meet

        # Inference's host cut off for longer than the orchestrator's timeout: it stops, naming that host.
        while len(rows(metrics)) < max(CUT_AT, done_before + 2) and procs["orchestrator"].poll() is None:
            time.sleep(0.2)
        assert len(rows(metrics)) <= STEPS - 2, log_tails(tmp_path)  # steps left for the orchestrator started again
        net.cut("inference")
        rc = procs["orchestrator"].wait(timeout=120)
        net.mend("inference")
        said = [ln for ln in (logs / "orchestrator.log").read_text().splitlines() if ln.startswith("error:")]
        assert rc == 2 and len(said) == 1, log_tails(tmp_path)
        # one line naming the host: no answer in the timeout, or no route to it once its address is known gone
        assert said[0].startswith(f"error: inference at {url} "), said
        procs["orchestrator"] = start("orchestrator")  # started again once the host is back: it follows the trainer
        assert procs["orchestrator"].wait(timeout=900) == 0, log_tails(tmp_path)
        assert procs["trainer"].wait(timeout=300) == 0 and procs["trainer2"].wait(timeout=60) == 0, log_tails(tmp_path)
        assert serving(url) == STEPS
        tokens, logprobs = probe(url, tiny_model_dir)  # same seed, new weights: new tokens or at least new log-probs
        n = min(len(logprobs), len(before[1]))
        assert tokens != before[0] or max(abs(x - y) for x, y in zip(logprobs[:n], before[1][:n])) > 1e-3
        # and they are the trainer's: its final checkpoint gives the served tokens the served log-probs, the step before's do not
        ckpts = tmp_path / "trainer" / "checkpoints"
        final, previous = (scored(ckpts / f"step_{s}", tiny_model_dir, tokens, tmp_path) for s in (STEPS, STEPS - 2))
        apart = [max(abs(x - y) for x, y in zip(mine, logprobs)) for mine in (final, previous)]
        print(f"served log-probs against step {STEPS}'s checkpoint: {apart[0]:.2e} apart; step {STEPS - 2}'s: {apart[1]:.2e}")
        assert apart[0] < SAME and apart[1] > 10 * SAME, (apart, final, previous, logprobs)
    finally:
        done.set()
        watcher.join()
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=60)

    print(f"relay cut {RELAY_CUT_S} s: trainer at step {published}, inference served v{sorted(held)} (probe answered {len(served[0])} tokens), caught up {caught_up:.1f} s after")
    edges, breaches = host_sockets.judge(seen, a, SERVICES, net.operator)
    assert not breaches, breaches
    assert EDGES <= edges, (EDGES - edges, seen)
    trainer = rows(metrics)
    assert [r["step"] for r in trainer] == list(range(STEPS)), log_tails(tmp_path)  # nothing repeated, nothing skipped
    assert done_before < STEPS
    orch = rows(tmp_path / "orchestrator" / "orchestrator" / "metrics.jsonl")
    assert sorted({r["step"] for r in orch if "reward" in r}) == list(range(STEPS))  # steps in flight at the cut: again
    assert max(r.get("trainer_restarts", 0) for r in orch) == 1  # the first orchestrator saw the trainer start again
    assert orch[-1]["eval_version"] == STEPS
    assert all(r["trained_tokens"] > 0 for r in trainer)
    evals = [r for r in orch if "eval_reward" in r]
    # held-out at the start, again where the orchestrator follows the restarted trainer and where it starts again, and at the end
    assert evals[0]["eval_version"] == 0 and len(evals) == 4 and evals[-1]["eval_version"] == STEPS
    print(f"held-out reward {evals[0]['eval_reward']:.3f} -> {evals[-1]['eval_reward']:.3f}")  # its rise: test_rl_volunteers
    assert (logs / "trainer.log").read_text().count("world 2 (gloo)") == 2  # both starts: one rank on each node
    # Each directory holds its own process's files only: the orchestrator never saw a checkpoint.
    assert sorted(p.name for p in (tmp_path / "orchestrator").iterdir()) == ["orchestrator", "wandb"]
    assert sorted(p.name for p in (tmp_path / "inference").iterdir()) == [f"inference-{PORTS['inference']}"]  # SHARDCAST downloads
    assert {"checkpoints", "shardcast", "trainer"} <= {p.name for p in (tmp_path / "trainer").iterdir()}
    # The same numbers in W&B: the resumed trainer's run holds exactly the rows it trained.
    resumed = history(runs(tmp_path / "trainer")[-1])
    assert resumed == [r for r in trainer if r["step"] >= resumed[0]["step"]] and resumed[0]["step"] <= done_before
    assert history(runs(tmp_path / "orchestrator")[-1])[-1]["eval_reward"] == orch[-1]["eval_reward"]
    stats = json.loads((tmp_path / "inference" / f"inference-{PORTS['inference']}" / "stats.json").read_text())
    print(f"inference fetched {stats['steps']} steps, {stats['delta_steps']} as deltas ({stats['delta_failed']} refused)")
    assert stats["delta_failed"] <= 3  # the steps the restarted trainer published again differ; later deltas apply
