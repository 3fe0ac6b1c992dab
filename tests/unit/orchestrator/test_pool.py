"""The pool of inference nodes (orchestrator/pool.py): requests go round-robin over the live nodes;
a node joins and leaves at run time, a trusted one (the run's own server) never leaves, a request
that must go to a trusted node never picks another, and an empty pool is one clear error naming
why each node left."""

import pytest

from composer_prime.orchestrator.pool import HttpNode, Node, NodePool, NoNodes


class Untrusted(Node):
    trusted = False

    def __init__(self, name: str) -> None:
        self.name = name


def trusted(url: str) -> HttpNode:
    return HttpNode(url, "tiny", post=None)


def test_round_robin_over_the_nodes_as_they_join_and_leave():
    pool = NodePool([trusted("http://a"), trusted("http://b")])
    assert [pool.pick().name for _ in range(4)] == ["http://a", "http://b", "http://a", "http://b"]
    pool.join(Untrusted("volunteer:v"))
    assert sorted(pool.pick().name for _ in range(3)) == ["http://a", "http://b", "volunteer:v"]  # each once in turn
    assert {pool.pick(trusted=True).name for _ in range(6)} == {"http://a", "http://b"}  # a trusted-only request
    assert [n.trusted for n in pool.nodes.values()] == [True, True, False]
    pool.leave("http://a", "unreachable")  # trusted: stays
    pool.leave("volunteer:v", "ejected: 3 rejected rollouts")
    assert sorted(pool.nodes) == ["http://a", "http://b"] and pool.left == {"volunteer:v": "ejected: 3 rejected rollouts"}
    assert pool.trusted() == ["http://a", "http://b"]
    pool.join(Untrusted("volunteer:v"))  # back
    assert "volunteer:v" in pool.nodes and pool.left == {}


def test_an_empty_pool_says_why_each_node_left():
    pool = NodePool([])
    pool.join(Untrusted("volunteer:v"))
    pool.leave("volunteer:v", "unreachable")
    with pytest.raises(NoNodes, match=r"no inference node left \(volunteer:v: unreachable\)"):
        pool.pick()
    with pytest.raises(NoNodes):
        NodePool([Untrusted("volunteer:w")]).pick(trusted=True)
