"""`[trainer.nodes]`: what one trainer on several machines refuses at load time, with the key to change,
and which ports each node listens on (node 0 alone receives batches, publishes and hosts the
rendezvous; the others only connect)."""

import pytest

from composer_prime.config import TrainerConfig
from composer_prime.config.base import FieldError
from composer_prime.config.nodes import NodesConfig

BAD = [  # (settings, the key the error names)
    ({"count": 2, "rank": 2}, "rank"),
    ({"count": 2, "master": "10.0.0.1"}, "master"),  # no port
    ({"count": 2, "master": "10.0.0.1:0"}, "master"),  # every node must know the port
    ({"count": 2, "master": "10.0.0.1:29500"}, "master"),  # an unauthenticated store beyond loopback, nobody vouching
]


@pytest.mark.parametrize("settings,key", BAD, ids=[f"{k}-{i}" for i, (_, k) in enumerate(BAD)])
def test_refused_with_its_key(settings, key):
    with pytest.raises(ValueError) as e:
        NodesConfig(**settings)
    [err] = e.value.errors()
    cause = err["ctx"]["error"]
    assert isinstance(cause, FieldError) and cause.key == key, cause


def test_replicas_divide_every_node_s_ranks():
    """HSDP's replica groups span nodes: 2 nodes of 2 ranks hold 4, so dp_replicate 4 fits where nproc alone is 2."""
    nodes = {"count": 2, "master": "10.0.0.1:29500", "trusted_network": True}
    assert TrainerConfig(nproc=2, dp_replicate=4, nodes=nodes).world_size() == 4
    with pytest.raises(ValueError, match="does not divide the 4 ranks"):
        TrainerConfig(nproc=2, dp_replicate=3, nodes=nodes)


def test_only_node_0_listens():
    nodes = {"count": 2, "master": "10.0.0.1:29500", "trusted_network": True}
    first = TrainerConfig(nodes=nodes, transport={"address": "tcp://10.0.0.1:5557"})
    assert [(k, h, p) for k, h, p in first.binds()] == [("transport.address", "10.0.0.1", 5557),
                                                         ("nodes.master", "10.0.0.1", 29500)]
    assert TrainerConfig(nodes={**nodes, "rank": 1}, transport={"address": "tcp://10.0.0.1:5557"}).binds() == []
    assert [k for k, _, _ in TrainerConfig().binds()] == ["transport.address"]  # one node: no rendezvous of its own
