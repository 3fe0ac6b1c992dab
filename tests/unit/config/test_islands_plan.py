"""What `rl` starts for DiLoCo islands (config/plan.plan_islands), and each island's share of the
tasks (orchestrator.island_share), without starting anything."""

import pytest

from composer_prime.config import RLConfig
from composer_prime.config.plan import plan_islands
from composer_prime.orchestrator.orchestrator import island_share


def test_every_island_here_with_its_own_ports_directory_and_lighthouse():
    cfg = RLConfig.model_validate({"output_dir": "out", "diloco": {"islands": 3, "lighthouse_port": 29600},
                                   "inference": {"port": 8000}, "transport": {"address": "tcp://127.0.0.1:5557"}})
    procs = {p.name: p.config for p in plan_islands(cfg)}
    assert sorted(procs) == [f"island{k}-{n}" for k in range(3) for n in ("inference", "orchestrator", "trainer")] + ["lighthouse"]
    assert (procs["lighthouse"].host, procs["lighthouse"].port) == ("127.0.0.1", 29600)
    for k in range(3):
        inf, orch, tr = (procs[f"island{k}-{n}"] for n in ("inference", "orchestrator", "trainer"))
        assert inf.port == 8000 + 10 * k and orch.inference_urls == tr.inference_urls == [f"http://127.0.0.1:{8000 + 10 * k}"]
        assert orch.transport.address == tr.transport.address == f"tcp://127.0.0.1:{5557 + 10 * k}"
        assert str(tr.output_dir) == str(orch.output_dir) == f"out/island{k}"
        assert (orch.island, orch.islands) == (k, 3)
        assert (tr.diloco.island, tr.diloco.lighthouse) == (k, "127.0.0.1:29600")


def test_one_island_of_a_run_on_other_machines_starts_no_lighthouse():
    cfg = RLConfig.model_validate({"diloco": {"islands": 2, "island": 1, "lighthouse": "10.1.2.3:29510"}})
    procs = {p.name: p.config for p in plan_islands(cfg)}
    assert sorted(procs) == ["island1-inference", "island1-orchestrator", "island1-trainer"]
    assert procs["island1-trainer"].diloco.lighthouse == "10.1.2.3:29510"


def test_island_shares_are_disjoint_and_cover_the_tasks():
    tasks = list(range(10))
    shares = [island_share(tasks, k, 3, "env") for k in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(SystemExit, match="2 train tasks cannot be shared by 3 islands"):
        island_share([0, 1], 2, 3, "env")
