"""A config error names the place that set the offending value (issue 24: `--trainer.loss.weights.nosuch 1`
after `@ configs/quickstart.toml` was blamed on the file, which set only other keys of `trainer`).

Each bad value is set in the first of two files, in the second, or on the command line, while the
other places set neighbouring keys of the same sections: the error must name the bad value's key
and its place, never a place that only set a neighbour. Through the loader and `split`, as `rl`
resolves a config."""

from pathlib import Path

import pytest
import tomli_w

from composer_prime.config import RLConfig
from composer_prime.config.loader import ConfigError, parse_argv, place_of, validate
from composer_prime.config.plan import plan

# neighbours of every bad value below, in the same sections (never the bad key itself: a later place would win)
NEIGHBOURS = {"max_steps": 30, "inference": {"port": 8001, "max_model_len": 256},
              "orchestrator": {"batch_size": 64, "sampling": {"max_tokens": 8}, "distill": {"max_sites": 2}},
              "trainer": {"optim": {"warmup_steps": 5}, "loss": {"weights": {"rl": 1.0}}},
              "weight_broadcast": {"shard_size": 1000}}

# (dotted key, bad value, the key the error names, what else the run needs set alongside, on the command line)
BAD = [
    ("trainer.loss.weights.nosuch", 1, "trainer.loss.weights.nosuch", []),  # a key of a dict-valued field
    ("trainer.optim.lr", -1.0, "trainer.optim.lr", []),
    ("trainer.optim.betas", [0.9, 1.5], "trainer.optim.betas.1", []),  # an item of a list
    ("orchestrator.envs", [{"id": "reverse-text", "ratio": -1}], "orchestrator.envs.0.ratio", []),  # inside a list of tables
    ("orchestrator.nosuch", {"a": 1}, "orchestrator.nosuch", []),  # an unknown table
    ("trainer.optim.nosuch", 1, "trainer.optim.nosuch", []),  # an unknown key
    ("inference.vllm_args", ["--port=9"], "inference.vllm_args", []),  # a model's own check
    ("trainer.max_steps", 7, "trainer.max_steps", []),  # a conflict with the top level
    # a channel's check against the orchestrator (a FieldError: its key)
    ("trainer.loss.distill.estimator", "sampled", "trainer.loss.distill.estimator",
     ["--orchestrator.distill.enabled", "true", "--orchestrator.distill.teacher", "inference"]),
    ("weight_broadcast.keep_last", 1, "weight_broadcast.keep_last",  # the plan's check, on the trainer's filled-in copy
     ["--weight_broadcast.type", "shardcast"]),
]


def nested(dotted: str, value: object) -> dict:
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def toml(path: Path, tree: dict) -> str:
    path.write_text(tomli_w.dumps(tree))
    return str(path)


def error_of(argv: list[str]) -> str:
    tree, provenance, _ = parse_argv(argv)
    with pytest.raises(ConfigError) as e:
        plan(validate(RLConfig, tree, provenance), provenance)
    return str(e.value)


def cli(value: object) -> str:
    return tomli_w.dumps({"v": value})[4:].strip() if isinstance(value, list) else str(value)


@pytest.mark.parametrize("key, value, named, needs", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("where", ["first file", "second file", "command line"])
def test_the_error_names_where_the_bad_value_was_set(tmp_path, where, key, value, named, needs):
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    if where == "first file":
        argv, place = ["@", toml(first, nested(key, value)), "@", toml(second, NEIGHBOURS)], str(first)
    elif where == "second file":
        argv, place = ["@", toml(first, NEIGHBOURS), "@", toml(second, nested(key, value))], str(second)
    else:
        argv, place = ["@", toml(first, NEIGHBOURS), f"--{key}", cli(value)], "command line"
    line = error_of([*argv, *needs])
    assert line.startswith(f"{named}") and line.endswith(f"({place})"), line
    assert str(first if place != str(first) else second) not in line  # the place of a neighbour is never named


def test_the_issue_command():
    line = error_of(["@", "configs/quickstart.toml", "--trainer.loss.weights.nosuch", "1"])
    assert line.startswith("trainer.loss.weights.nosuch: unknown loss channel 'nosuch'") and line.endswith("(command line)")


def test_a_table_set_in_several_places_names_each():
    _, provenance, _ = parse_argv(["@", "configs/quickstart.toml", "--trainer.optim.lr", "1e-3", "--trainer.cpus", "[0]"])
    assert place_of("trainer.optim", provenance) == "configs/quickstart.toml, command line"
    assert place_of("trainer.optim.lr", provenance) == "command line"
    assert place_of("trainer.optim.warmup_steps", provenance) == "configs/quickstart.toml"
    assert place_of(("trainer", "cpus", 0), provenance) == "command line"  # inside a list: where the list was set
    assert place_of("trainer.optim.max_norm", provenance) == "defaults"


def test_a_value_set_again_is_where_it_was_set_last(tmp_path):
    first = toml(tmp_path / "first.toml", {"trainer": {"loss": {"weights": {"rl": 1.0, "ce": 0.5}}}})
    _, provenance, _ = parse_argv(["@", first, "--trainer.loss.weights", '{"rl": 2.0}'])
    assert {k: v for k, v in provenance.items() if k.startswith("trainer.loss")} == {"trainer.loss.weights.rl": "command line"}
