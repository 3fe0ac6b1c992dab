"""`rl` with weights through SHARDCAST: trainer origin → one relay → two inference servers."""

import json
import subprocess
import sys
import tomllib

from tests.conftest import ROOT, free_port

STEPS = 30


def test_rl_learns_with_weights_through_a_relay_to_two_inference_servers(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    origin_port = free_port()
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "@", "configs/shardcast.toml",
           "--output_dir", str(run), "--max_steps", str(STEPS), "--inference.port", str(free_port()),
           "--weight_broadcast.port", str(origin_port), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
           "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "96"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:]

    configs = {p.stem: tomllib.loads(p.read_text()) for p in (run / "configs").glob("*.toml")}
    assert sorted(configs) == ["inference-0", "inference-1", "orchestrator", "relay-0", "trainer"]
    relay_url = f"http://127.0.0.1:{configs['relay-0']['port']}"
    for name in ("inference-0", "inference-1"):
        wb = configs[name]["weight_broadcast"]
        assert wb["type"] == "shardcast" and wb["servers"] == [relay_url] and wb["public_key"] == str(run / "keys" / "trainer.ed25519.pub")
        stats = json.loads((run / f"inference-{configs[name]['port']}" / "stats.json").read_text())
        assert stats["loaded_step"] == STEPS and stats["refused_steps"] == 0, stats  # the last step reached both servers
    assert configs["relay-0"]["upstream"] == [f"http://127.0.0.1:{origin_port}"]
    assert (run / "keys" / "trainer.ed25519").stat().st_mode & 0o777 == 0o600  # made by rl at launch
    assert len((run / "keys" / "trainer.ed25519.pub").read_text().strip()) == 64
    mirrored = (run / "relay-0" / "distribution.txt").read_text().splitlines()
    assert mirrored and mirrored[-1].split(":")[0] == f"v{STEPS}", mirrored  # the relay served the last step

    trainer = [json.loads(ln) for ln in (run / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trainer] == list(range(STEPS))
    rows = [json.loads(ln) for ln in (run / "orchestrator" / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in rows if "eval_reward" in x]
    assert evals[0]["eval_version"] == 0 and evals[-1]["eval_version"] == STEPS
    assert evals[-1]["eval_reward"] > evals[0]["eval_reward"] + 0.03, evals
    # Retention follows the async window: the origin lists only the last keep_last steps.
    listed = (run / "shardcast" / "distribution.txt").read_text().splitlines()
    assert [ln.split(":")[0] for ln in listed] == [f"v{s}" for s in range(STEPS - 2, STEPS + 1)]
