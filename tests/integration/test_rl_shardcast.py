"""`rl` with weights through SHARDCAST: trainer origin → one relay → two inference servers. The run is
the session's `relay_run` (tests/support/shared_runs.py: the volunteers' quickstart, whose weights take
this path to its two trusted servers and to the volunteers alike)."""

import json
import tomllib

import pytest

from tests.support.rl_runs import rows
from tests.support.shared_runs import RELAY_STEPS, RelayRun


@pytest.mark.alone  # workers starting on a loaded machine joined after the run had ended (seed 2, load 10)
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
    assert evals[0]["eval_version"] == 0 and evals[-1]["eval_version"] == RELAY_STEPS  # learning: test_rl_volunteers.py
    # Retention follows the async window: the origin lists only the last keep_last steps.
    listed = (run / "shardcast" / "distribution.txt").read_text().splitlines()
    assert [ln.split(":")[0] for ln in listed] == [f"v{s}" for s in range(RELAY_STEPS - 2, RELAY_STEPS + 1)]
