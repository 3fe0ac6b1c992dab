"""The pool of inference nodes (orchestrator/pool.py): requests go round-robin over the live nodes;
a node joins and leaves at run time, a trusted one (the run's own server) never leaves, and an
empty pool is one clear error naming why each node left."""

import pytest

from composer_prime.orchestrator.pool import NodePool, NoNodes


def test_round_robin_over_the_nodes_as_they_join_and_leave():
    pool = NodePool(["http://a", "http://b"])
    assert [pool.pick().url for _ in range(4)] == ["http://a", "http://b", "http://a", "http://b"]
    pool.join("http://v")  # a volunteer
    assert sorted(pool.pick().url for _ in range(3)) == ["http://a", "http://b", "http://v"]  # each once in turn
    assert [n.trusted for n in pool.nodes.values()] == [True, True, False]
    pool.leave("http://a", "unreachable")  # trusted: stays
    pool.leave("http://v", "ejected: 3 rejected rollouts")
    assert sorted(pool.nodes) == ["http://a", "http://b"] and pool.left == {"http://v": "ejected: 3 rejected rollouts"}
    assert pool.trusted() == ["http://a", "http://b"]
    pool.join("http://v")  # back
    assert "http://v" in pool.nodes and pool.left == {}


def test_an_empty_pool_says_why_each_node_left():
    pool = NodePool([])
    pool.join("http://v")
    pool.leave("http://v", "unreachable")
    with pytest.raises(NoNodes, match=r"no inference node left \(http://v: unreachable\)"):
        pool.pick()
