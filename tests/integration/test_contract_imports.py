"""Importing the contract loads no torch, checked in a fresh interpreter: in a pytest process torch
is loaded long before any test runs, so only a new process can tell what an import pulls in.

So the orchestrator's side of a channel (which builds the contract's types, and which a config
check of every `rl` start loads) stays free of the trainer's dependencies."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

HEAVY = {"torch", "transformers"}


def loaded_by(modules: list[str]) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after importing `modules`."""
    code = "import sys\nfor m in sys.argv[1:]:\n    __import__(m)\nprint(' '.join(k for k in sys.modules if '.' not in k))"
    out = subprocess.run([sys.executable, "-c", code, *modules], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_contract_and_the_orchestrators_distill_step_load_no_torch():
    names = sorted(p.stem for p in (ROOT / "composer_prime" / "contract").glob("*.py"))
    assert names == ["__init__", "audit", "batches", "distill", "dpo", "inference", "volunteer", "weights"]
    contract = ["composer_prime.contract"] + [f"composer_prime.contract.{n}" for n in names[1:]]
    assert loaded_by(contract) & HEAVY == set()
    assert loaded_by(["composer_prime.orchestrator.distill", "composer_prime.orchestrator.replay"]) & HEAVY == set()
    assert loaded_by(["composer_prime.trainer.loss.distill_teacher"]) & HEAVY == {"torch"}  # the probe sees torch
