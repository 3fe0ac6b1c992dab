"""The import structure of `composer_prime/`: no import circle, and every import goes one way,
down a declared order of its packages (read from the source: tests/support/import_graph.py).

The rule: the packages stand in `ORDER`, lowest first, some side by side on one level; a module
may import its own package and the packages of lower levels, and nothing else. Packages on one
level are separate processes and never import each other: what they exchange is defined once,
in `contract`, at the bottom, which every package may import and which imports none of them.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT
from tests.support.import_graph import against_order, circles, imports, modules, unit

ORDER: list[tuple[str, ...]] = [
    ("contract",),  # what crosses a process boundary (batches, channel data, inference answers)
    ("utils",),
    ("transports",),  # moving bytes: batches over ZMQ, weights over a filesystem or SHARDCAST
    ("config",),
    ("model",),
    ("env_runtime",),  # running environments (the orchestrator and the hub tooling use it)
    ("traces",),  # agent traces: ingest, replay, pairs, datasets (reads tool calls as the environments write them)
    ("verify",),  # checking an untrusted node's work: TOPLOC proofs, sampling replay (the inference server audits)
    ("inference", "trainer", "orchestrator"),  # the three processes: they meet only through the contract
    ("hub", "volunteer"),  # `composer-prime env ...` tooling; the volunteers: the run's pool, validator and nodes
    # (a node source of the orchestrator's, by entry point) and a volunteer's worker
    ("entrypoints",),
]


def test_composer_prime_has_no_import_circle():
    assert circles(imports(ROOT / "composer_prime")) == []


def test_composer_prime_imports_only_down_the_order():
    assert sorted(against_order(imports(ROOT / "composer_prime"), ORDER)) == []


def test_the_volunteer_side_meets_the_client_only_through_the_node_interface_and_the_contract():
    """No import from orchestrator/client.py into the volunteer side (its nodes join the client's pool as
    `Node`s, its validator gets the audit as a callable), none back; the audit and join answer types come
    from the contract on both sides (the server and client, the pool and the worker)."""
    edges = imports(ROOT / "composer_prime")
    volunteer = {b for a, b in edges if a.startswith("composer_prime.volunteer")}
    assert "composer_prime.orchestrator.client" not in volunteer
    assert not {b for a, b in edges if a == "composer_prime.orchestrator.client" and ".volunteer" in b}
    assert volunteer & {"composer_prime.orchestrator.pool", "composer_prime.contract.audit", "composer_prime.contract.volunteer",
                        "composer_prime.contract.weights"} == {"composer_prime.orchestrator.pool", "composer_prime.contract.audit",
                                                               "composer_prime.contract.volunteer", "composer_prime.contract.weights"}
    for user in ("composer_prime.inference.server", "composer_prime.orchestrator.client"):
        assert (user, "composer_prime.contract.audit") in edges
    for user in ("composer_prime.volunteer.door", "composer_prime.volunteer.worker"):
        assert (user, "composer_prime.contract.volunteer") in edges


def test_every_package_has_its_place_in_the_order():
    placed = [u for level in ORDER for u in level]
    assert sorted({unit(m) for m in modules(ROOT / "composer_prime")} - {""}) == sorted(placed)
    assert len(placed) == len(set(placed))


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_checks_find_a_sideways_import_circles_and_literal_loads(tmp_path):
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/contract/__init__.py": "from pkg.contract.wire import Teacher\n",  # a thin re-export: no circle
        "pkg/contract/wire.py": "class Teacher: ...\n",
        "pkg/trainer/__init__.py": "",
        "pkg/trainer/loss.py": "from pkg.contract.wire import Teacher\n",  # runs pkg.contract's __init__: no edge
        "pkg/trainer/cli.py": "from importlib import import_module\n\n\ndef load(name):\n"
                              "    return import_module(f'pkg.contract.{name}')\n",  # every module it can name
        "pkg/orchestrator/__init__.py": "",
        "pkg/orchestrator/teachers.py": "def view():\n    from pkg.trainer.loss import Teacher\n",  # lazy: still an edge
        "pkg/orchestrator/steps.py": "import importlib\n\nSTEPS = importlib.import_module('pkg.orchestrator.teachers')\n",
        "pkg/orchestrator/a.py": "import pkg.orchestrator.b\n",
        "pkg/orchestrator/b.py": "a = __import__('pkg.orchestrator.a')\n",
        "pkg/shard/__init__.py": "from pkg.shard.origin import Origin\n",  # re-exports a submodule ...
        "pkg/shard/origin.py": "from pkg.shard import payload\n",  # ... that imports the package back
        "pkg/shard/payload.py": "",
        "pkg/shard/store.py": "from .payload import pack\n",
    })
    edges = imports(pkg)
    assert edges == {
        ("pkg.contract", "pkg.contract.wire"),
        ("pkg.trainer.loss", "pkg.contract.wire"),
        ("pkg.trainer.cli", "pkg.contract.wire"),
        ("pkg.orchestrator.teachers", "pkg.trainer.loss"),
        ("pkg.orchestrator.steps", "pkg.orchestrator.teachers"),
        ("pkg.orchestrator.a", "pkg.orchestrator.b"),
        ("pkg.orchestrator.b", "pkg.orchestrator.a"),
        ("pkg.shard", "pkg.shard.origin"),
        ("pkg.shard.origin", "pkg.shard.payload"),
        ("pkg.shard.origin", "pkg.shard"),
        ("pkg.shard.store", "pkg.shard.payload"),
    }
    assert circles(edges) == [["pkg.orchestrator.a", "pkg.orchestrator.b"], ["pkg.shard", "pkg.shard.origin"]]
    order = [("contract",), ("shard",), ("trainer", "orchestrator")]
    assert against_order(edges, order) == {("pkg.orchestrator.teachers", "pkg.trainer.loss")}  # peers: sideways
    assert against_order(edges, [("trainer", "orchestrator"), ("contract", "shard")]) == {  # upward
        ("pkg.trainer.loss", "pkg.contract.wire"), ("pkg.trainer.cli", "pkg.contract.wire"),
        ("pkg.orchestrator.teachers", "pkg.trainer.loss")}
    assert against_order(edges, [("contractual",), ("shard",), ("trainer", "orchestrator")]) == {  # names match exactly
        ("pkg.trainer.loss", "pkg.contract.wire"), ("pkg.trainer.cli", "pkg.contract.wire"),
        ("pkg.orchestrator.teachers", "pkg.trainer.loss")}
