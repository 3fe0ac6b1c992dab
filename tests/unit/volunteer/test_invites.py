"""Invites (volunteer/invites.py) and the pool's admission (volunteer/door.py) through its
real routes (FastAPI's test client, no socket): a token per volunteer, stored hashed; an ejected
node's invite revoked, so a fresh key with the same token is refused and the invite's other keys
are ejected with it; a revocation seen by nodes already in the pool; an open run's limits per
address, per second and overall."""

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import hello, node_id
from composer_prime.orchestrator.pool import NodePool
from composer_prime.contract.weights import Directory
from composer_prime.volunteer.pool import VolunteerPool
from composer_prime.volunteer.invites import InviteError, Invites, token_hash


def pool(tmp_path: Path, token: str | None = None, **cfg) -> tuple[VolunteerPool, TestClient]:
    v = VolunteersConfig(enabled=True, open=token is not None, join_token=token, **cfg)
    p = VolunteerPool(v, NodePool([]), token, Directory("/run/weights"), "tiny", Invites(tmp_path / "invites.json"))
    return p, TestClient(p.door.app())


def join(http: TestClient, token: str, key=None):
    key = key or Ed25519PrivateKey.generate()
    return http.post("/pool/join", json=hello(key, "join", token=token)), node_id(key)


def test_the_store_keeps_only_the_tokens_hash_and_refuses_a_name_twice(tmp_path):
    invites = Invites(tmp_path / "invites.json")
    token = invites.invite("alice")
    stored = json.loads((tmp_path / "invites.json").read_text())
    assert stored["alice"]["sha256"] == token_hash(token) and token not in (tmp_path / "invites.json").read_text()
    assert (tmp_path / "invites.json").stat().st_mode & 0o777 == 0o600
    assert invites.find(token)[0] == "alice" and invites.find(token + "x") is None
    with pytest.raises(InviteError, match="exists already"):
        invites.invite("alice")
    with pytest.raises(InviteError, match="letters"):
        invites.invite("../bob")
    (tmp_path / "invites.json").write_text("[1, 2]")
    with pytest.raises(InviteError, match="not an invites file"):
        invites.find(token)


def test_only_an_invites_token_joins_a_closed_run(tmp_path):
    p, http = pool(tmp_path)
    token = p.invites.invite("alice")  # made while the pool runs: read at the next join
    ok, node = join(http, token)
    assert ok.status_code == 200 and p.members[node].invite == "alice"
    assert join(http, "a-guess")[0].status_code == 403 and p.refused["bad_token"] == 1


def test_ejecting_a_node_revokes_its_invite_and_ejects_the_inviters_other_keys(tmp_path):
    """Ejection sticks to the identity: a fresh key with the same token is refused (before: 200)."""
    p, http = pool(tmp_path)
    token = p.invites.invite("mallory")
    (_, a), (_, b) = join(http, token), join(http, token)
    p.verdict(a, "toploc")
    p.verdict(a, "sampling")  # 2 strikes: ejected
    assert set(p.ejected) == {a, b} and p.members[b].status == "ejected"
    again, fresh = join(http, token)
    assert again.status_code == 403 and "revoked" in again.json()["detail"] and fresh not in p.members
    assert Invites(tmp_path / "invites.json").table()["mallory"]["revoked"].startswith(f"node {a[:12]} ejected")


def test_a_revocation_by_the_operator_ejects_the_invites_nodes_at_their_next_request(tmp_path):
    p, http = pool(tmp_path)
    key = Ed25519PrivateKey.generate()
    assert join(http, p.invites.invite("carol"), key)[0].status_code == 200
    Invites(tmp_path / "invites.json").revoke("carol", "left the project")  # another process: the CLI
    beat = http.post("/pool/heartbeat", json=hello(key, "heartbeat"))
    assert beat.status_code == 403 and "ejected" in beat.json()["detail"] and node_id(key) in p.ejected


def test_an_invite_has_at_most_keys_per_invite_nodes(tmp_path):
    p, http = pool(tmp_path, keys_per_invite=2)
    token = p.invites.invite("dave")
    assert [join(http, token)[0].status_code for _ in range(3)] == [200, 200, 403]
    assert p.refused["keys_per_invite"] == 1


def test_an_open_run_limits_nodes_per_address_joins_per_second_and_members(tmp_path):
    p, http = pool(tmp_path, "open-token", members_per_address=2, join_rate=1e-9, join_burst=4, max_members=3)
    assert [join(http, "open-token")[0].status_code for _ in range(3)] == [200, 200, 403]  # per address ("testclient")
    assert join(http, "open-token")[0].status_code == 403 and join(http, "open-token")[0].status_code == 429  # bucket of 4
    assert (p.refused["members_per_address"], p.refused["join_limited"]) == (2, 1)
    p, http = pool(tmp_path, "open-token", members_per_address=10, max_members=2)
    (_, a), (_, b) = join(http, "open-token"), join(http, "open-token")
    assert join(http, "open-token")[0].status_code == 403 and p.refused["full"] == 1  # full of healthy nodes
    p._gone(p.members[a], "dead")
    ok, c = join(http, "open-token")
    assert ok.status_code == 200 and sorted(p.members) == sorted([b, c])  # the dead node made room
