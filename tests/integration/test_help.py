"""`--help` on every entrypoint: exit code 0 and every option with its description.

The config entrypoints' help is generated from the pydantic models; the expected options are
walked from the same models here, so a field the help leaves out (or a description it drops)
fails. `composer-prime` and its subcommands are argparse; their options come from the parser.
"""

import argparse
import os
import subprocess
import sys
import types

import pytest
from pydantic import BaseModel

from composer_prime.config import InferenceConfig, OrchestratorConfig, RelayConfig, RLConfig, SFTConfig, TrainerConfig
from composer_prime.config.diloco import LighthouseConfig
from composer_prime.config.help import Section, plugin_sections
from composer_prime.entrypoints.cli import parser
from tests.conftest import ROOT
from tests.support import forkserver

ENTRYPOINTS = {"rl": RLConfig, "inference": InferenceConfig, "orchestrator": OrchestratorConfig,
               "trainer": TrainerConfig, "relay": RelayConfig, "sft": SFTConfig, "lighthouse": LighthouseConfig}


def leaves(model: type[BaseModel], prefix: str = "", skip: tuple = ()):
    """(owning model, dotted key, field) of every option a user can set."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        section = next((m for m in field.metadata if isinstance(m, Section)), None)
        annotation = field.annotation
        optional = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]  # `X | None`
        if isinstance(annotation, types.UnionType) and len(optional) == 1 and isinstance(optional[0], type) and issubclass(optional[0], BaseModel):
            annotation = optional[0]  # an optional section ([diloco]): its keys are options all the same
        item = getattr(annotation, "__args__", [None])[0] if getattr(annotation, "__origin__", None) is list else None
        if section is not None:
            yield from leaves(section.model, f"{prefix}{name}.", section.skip)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from leaves(annotation, f"{prefix}{name}.")
        else:
            yield model, f"{prefix}{name}", field
            if isinstance(item, type) and issubclass(item, BaseModel):
                yield from leaves(item, f"{prefix}{name}[*].")
    for name, config in plugin_sections(model).items():  # loss channels' and batch steps' own sections
        yield from leaves(config, f"{prefix}{name}.")


def flat(text: str) -> str:
    return " ".join(text.split())


def run(*args: str) -> subprocess.CompletedProcess:
    # wide: argparse wraps a description at its hyphens ("feature-" / "deletion"), which flat() cannot join
    return forkserver.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "COLUMNS": "1000"})


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_config_entrypoint_help_lists_every_option_with_its_description(name):
    r = run(f"composer_prime.entrypoints.{name}", "--help")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith(f"usage: {name} ")
    text = flat(r.stdout)
    found = list(leaves(ENTRYPOINTS[name]))
    assert len(found) >= 5  # lighthouse, the smallest, has 5
    for _, key, field in found:
        assert f"--{key} " in r.stdout, key
        if field.description:
            assert flat(field.description) in text, key
    assert "--dry-run" in r.stdout


def test_help_wins_over_a_bad_command_line():
    r = run("composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "--max_steps", "-5", "-h")
    assert r.returncode == 0 and r.stdout.startswith("usage: rl ")


def test_every_option_has_a_description():
    missing = sorted({key for config in ENTRYPOINTS.values() for owner, key, field in leaves(config)
                      if not field.description})
    assert missing == []


def subcommands(p: argparse.ArgumentParser, path: tuple = ()):
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subcommands(sub, (*path, name))


CLI = list(subcommands(parser()))


@pytest.mark.parametrize("path, p", CLI, ids=[" ".join(path) or "composer-prime" for path, _ in CLI])
def test_composer_prime_help_lists_every_option(path, p):
    r = run("composer_prime.entrypoints.cli", *path, "--help")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = flat(r.stdout)
    # every option and argument has a description (a subcommand's is given to each of its choices)
    assert [a.dest for a in p._actions if not a.help and not isinstance(a, argparse._SubParsersAction)] == []
    helps = [a.help for a in p._actions if a.help and a.help != argparse.SUPPRESS and "%(" not in a.help]
    helps += [c.help for a in p._actions if isinstance(a, argparse._SubParsersAction) for c in a._choices_actions]
    assert all(helps)
    for h in helps:
        assert flat(h) in text, h
    for name in (name for a in p._actions for name in a.option_strings):
        assert name in r.stdout, name
