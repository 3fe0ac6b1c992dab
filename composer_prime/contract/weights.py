"""Where a policy's weights are, as each reader of them is told: one type for all of them.

A `Shardcast` source (its servers and the trainer's ed25519 public key, hex) is what an inference
server's follower (transports/weights/shardcast/follow.py), a relay (its upstream) and a
volunteer's worker (the pool's join answer) read weights from; a `Directory` is the run's own
weights directory (`<output_dir>/weights/step_N`), for readers on the run's machine. On the wire
a source is a JSON object with its `type`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from composer_prime.contract.batches import SchemaError


@dataclass(frozen=True)
class Shardcast:
    servers: tuple[str, ...]  # SHARDCAST servers (the origin or relays), tried in turn
    public_key: str  # the trainer's ed25519 public key, hex: every step's manifest is signed with it


@dataclass(frozen=True)
class Directory:
    root: str  # step_N directories (utils/steps.py), each complete once its marker is there


WeightsSource = Shardcast | Directory


def to_json(source: WeightsSource) -> dict:
    kind = "shardcast" if isinstance(source, Shardcast) else "filesystem"
    return {"type": kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(source).items()}}


def from_json(body: object) -> WeightsSource:
    """The source a JSON object names; SchemaError for anything else."""
    if not isinstance(body, dict):
        raise SchemaError(f"a weights source is an object, not {type(body).__name__}")
    try:
        if body.get("type") == "shardcast":
            servers = body["servers"]
            if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
                raise SchemaError("a SHARDCAST source needs its servers (URLs)")
            return Shardcast(tuple(servers), str(body["public_key"]))
        if body.get("type") == "filesystem":
            return Directory(str(body["root"]))
    except KeyError as e:
        raise SchemaError(f"a {body.get('type')} weights source has no {e}") from None
    raise SchemaError(f"unknown weights source type {body.get('type')!r} (shardcast or filesystem)")
