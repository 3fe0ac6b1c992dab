"""Config resolution without a process: every shipped config, files composed and flags overridden, command-line value parsing, and the CPU split between processes."""


import pytest

from composer_prime.config import RLConfig, TrainerConfig
from composer_prime.config.loader import parse_argv, validate
from tests.conftest import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_resolves(path):
    tree, prov, _ = parse_argv(["@", str(path)])
    validate(RLConfig, tree, prov).split(prov)


def test_files_compose_and_flags_override(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text("max_steps = 3\n[trainer.optim]\nlr = 1e-3\nmax_norm = 2.0\n")
    b.write_text("[trainer.optim]\nlr = 5e-4\n")
    tree, prov, dry = parse_argv(["@", str(a), "@", str(b), "--trainer.optim.max-norm", "0.5", "--dry-run"])
    inf, orch, trainer = validate(RLConfig, tree, prov).split(prov)
    assert trainer.optim.lr == 5e-4 and trainer.optim.max_norm == 0.5 and dry
    assert trainer.max_steps == orch.max_steps == inf.max_steps == 3  # shared keys filled in
    assert trainer.transport.address == orch.transport.address


def test_cpu_pinning_is_per_process_and_checked():
    import os

    from composer_prime.config import RLConfig
    from composer_prime.config.plan import plan
    from composer_prime.utils.proc import pin_cpus

    procs = {p.name: p.config for p in plan(RLConfig.model_validate({"inference": {"cpus": [0]}, "trainer": {"cpus": [1]}}))}
    assert procs["inference"].cpus == [0] and procs["trainer"].cpus == [1] and procs["orchestrator"].cpus == []
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        TrainerConfig.model_validate({"cpus": [-1]})
    before = os.sched_getaffinity(0)
    with pytest.raises(SystemExit, match=r"trainer: cpus \[4096\] are not available"):
        pin_cpus([4096], "trainer")
    assert os.sched_getaffinity(0) == before  # a refused pin changes nothing


def test_rl_gives_inference_and_trainer_their_own_cores_unless_told(monkeypatch):
    from composer_prime.config import plan as planning

    monkeypatch.setattr(planning.os, "sched_getaffinity", lambda _: {2, 3, 5, 7})
    monkeypatch.setattr(planning, "has_gpu", lambda: False)
    cpus = lambda raw: {p.name: p.config.cpus for p in planning.plan(RLConfig.model_validate(raw))}  # noqa: E731
    hf = {"inference": {"engine": "hf"}}
    assert cpus(hf) == {"inference": [2, 3], "trainer": [5, 7], "orchestrator": []}
    for raw in ({"inference": {"engine": "vllm"}},  # vLLM binds its own threads
                {**hf, "orchestrator": {"cpus": [2]}},  # any cpus given: only what is asked
                {**hf, "inference_replicas": 2}, {**hf, "trainer": {"nproc": 2}}):
        assert all(c in ([], [2]) for c in cpus(raw).values()), raw
    monkeypatch.setattr(planning, "has_gpu", lambda: True)
    assert set(map(tuple, cpus(hf).values())) == {()}


def test_command_line_values_are_json_then_toml_then_strings():
    tree, _, _ = parse_argv(["--orchestrator.envs", '[{id = "tool-calc", args = {num_tasks = 5}}]', "--inference.cpus", "[0]",
                             "--output_dir", "outputs/a b", "--model", "tiny"])
    assert tree["orchestrator"]["envs"] == [{"id": "tool-calc", "args": {"num_tasks": 5}}]
    assert tree["inference"]["cpus"] == [0] and tree["output_dir"] == "outputs/a b" and tree["model"] == "tiny"


@pytest.mark.parametrize("argv", [["--max_steps"], ["--max_steps", "--dry-run"], ["--trainer.optim.lr"], ["--seed", "@", "x.toml"]])
def test_a_flag_given_no_value_is_refused_unless_it_is_on_off(argv, tmp_path):
    """`--max_steps` with its value forgotten was max_steps = 1 (pydantic reads True as 1), a run of one step."""
    from composer_prime.config.loader import ConfigError, load

    (tmp_path / "x.toml").write_text("")
    argv = [a if a != "x.toml" else str(tmp_path / "x.toml") for a in ["@", str(ROOT / "configs/quickstart.toml"), *argv]]
    key = argv[2].removeprefix("--")
    with pytest.raises(ConfigError, match=f"^--{key} was given no value \\(command line\\): write --{key} VALUE"):
        config, prov, _ = load(RLConfig, argv)
        config.split(prov)  # the processes' sections are validated here
    config, prov, _ = load(RLConfig, ["@", str(ROOT / "configs/quickstart.toml"), "--resume", "--orchestrator.dynamic_sampling"])
    _, orch, _ = config.split(prov)
    assert config.resume is True and orch.dynamic_sampling is True  # on/off keys: a bare flag is on
