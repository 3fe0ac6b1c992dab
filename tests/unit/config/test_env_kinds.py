"""An environment's kind and the keys only an OpenEnv (or only a verifiers) environment takes (config/envs.py EnvConfig)."""

import pytest

from composer_prime.config import OrchestratorConfig
from composer_prime.config.base import FieldError
from composer_prime.config.envs import EnvConfig


def test_an_openenv_environment_by_package_or_by_url():
    package = EnvConfig(id="openenv-calc", kind="openenv", servers=2, sessions=8)
    remote = EnvConfig(id="calc", kind="openenv", url="https://calc.example:8000", sessions=4, step_timeout_s=5)
    assert (package.url, package.servers, remote.servers, remote.step_timeout_s) == (None, 2, 1, 5.0)
    assert EnvConfig().kind == "verifiers"
    cfg = OrchestratorConfig.model_validate({"batch_size": 16, "envs": [{"id": "reverse-text"},
                                                                        {"id": "openenv-calc", "kind": "openenv"}]})
    assert cfg.groups_per_step() == {"reverse-text": 1, "openenv-calc": 1}


@pytest.mark.parametrize("fields,key", [
    ({"url": "http://127.0.0.1:8000"}, "url"),  # a verifiers package has no url
    ({"servers": 2}, "servers"),
    ({"sessions": 4}, "sessions"),
    ({"step_timeout_s": 5.0}, "step_timeout_s"),
    ({"kind": "openenv", "url": "http://127.0.0.1:8000", "servers": 2}, "servers"),  # a url is one server
    ({"kind": "openenv", "call_timeout_s": 5.0}, "call_timeout_s"),  # its reward comes with a step: step_timeout_s
])
def test_keys_that_do_not_fit_the_kind_are_refused_by_name(fields, key):
    with pytest.raises(ValueError) as e:
        EnvConfig(id="x", **fields)
    [error] = e.value.errors()
    assert isinstance(error["ctx"]["error"], FieldError) and error["ctx"]["error"].key == key


@pytest.mark.parametrize("fields", [{"kind": "gym"}, {"kind": "openenv", "url": "ws://127.0.0.1:8000"},
                                    {"kind": "openenv", "sessions": 0}, {"kind": "openenv", "step_timeout_s": 0},
                                    {"call_timeout_s": 0}])
def test_bad_values_are_refused(fields):
    with pytest.raises(ValueError):
        EnvConfig(id="x", **fields)
