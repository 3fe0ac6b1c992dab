"""`[diloco]` refuses, at load time and with the key to change, every combination torchft 0.2.0
refuses at run time (its DiLoCo raises on a sync_every that P does not divide, on τ ≥ H/P, on
α outside [0, 1]) and what would never commit or silently fall back (min_islands above islands,
FP8 quantisation without CUDA and Triton)."""

import pytest

from composer_prime.config import TrainerConfig
from composer_prime.config.base import FieldError
from composer_prime.config.diloco import DiLoCoConfig

BAD = [  # (settings, the key the error names)
    ({"sync_every": 6, "fragments": 4}, "sync_every"),  # H not a multiple of P
    ({"sync_every": 2, "fragments": 4}, "fragments"),  # more fragments than steps: said of fragments, the one asked
    ({"sync_every": 8, "fragments": 2, "delay": 4}, "delay"),  # τ = H/P
    ({"island": 2, "islands": 2, "lighthouse": "10.0.0.1:29510"}, "island"),
    ({"island": 0}, "lighthouse"),  # one island of many machines: where is everyone?
    ({"lighthouse": "10.0.0.1"}, "lighthouse"),
    ({"min_islands": 3, "islands": 2}, "min_islands"),
    ({"wire_dtype": "quantized"}, "wire_dtype"),  # this machine has no GPU
    ({"host": "10.0.0.2"}, "host"),  # torchft's endpoints beyond loopback, with nobody saying the network is private
]


@pytest.mark.parametrize("settings,key", BAD, ids=[k for _, k in BAD])
def test_refused_with_its_key(settings, key):
    with pytest.raises(ValueError) as e:
        DiLoCoConfig(**settings)
    [err] = e.value.errors()
    cause = err["ctx"]["error"]
    assert isinstance(cause, FieldError) and cause.key == key, cause


@pytest.mark.parametrize("settings,key", [({"alpha": 1.5}, "alpha"), ({"outer_momentum": 1.0}, "outer_momentum"),
                                          ({"fragments": 0}, "fragments")])
def test_ranges(settings, key):
    with pytest.raises(ValueError) as e:
        DiLoCoConfig(**settings)
    assert [err["loc"] for err in e.value.errors()] == [(key,)]


def test_defaults_and_their_sources():
    d = DiLoCoConfig()
    assert (d.outer_lr, d.outer_momentum, d.nesterov) == (0.7, 0.9, True)  # DiLoCo, INTELLECT-1
    assert (d.layout, d.alpha, d.delay, d.wire_dtype) == ("strided", 0.0, 0, "float32")
    assert d.lighthouse_address() == "http://127.0.0.1:29510" and d.host == "127.0.0.1"
    assert DiLoCoConfig(island=1, lighthouse="lh.example:4000").lighthouse_address() == "http://lh.example:4000"
    assert TrainerConfig().diloco is None and TrainerConfig(diloco={}).diloco == d


def test_beyond_loopback_only_on_a_network_said_to_be_private():
    from composer_prime.config.diloco import LighthouseConfig

    assert DiLoCoConfig(host="10.0.0.2", trusted_network=True).host == "10.0.0.2"
    with pytest.raises(ValueError, match="host: 0.0.0.0 is beyond loopback"):
        LighthouseConfig(host="0.0.0.0")
    assert LighthouseConfig(host="0.0.0.0", trusted_network=True).binds() == [("port", "0.0.0.0", 29510)]
