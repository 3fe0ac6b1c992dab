"""How the processes reach one another: the batch transport (ZMQ), the weights' broadcast (a shared
directory or SHARDCAST, through relays), the keys of whatever listens beyond loopback, and the relay's
own config. Split from config/models.py, which holds one config per process and nests these."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from composer_prime.config.base import CommaList, Port, Strict


class BatchTransportConfig(Strict):
    """Orchestrator -> trainer batches (ZMQ PUSH/PULL)."""

    address: str = Field("tcp://127.0.0.1:5557", description="tcp://HOST:PORT; the trainer binds it, the "
                                                             "orchestrator connects to it")

    @field_validator("address")
    @classmethod
    def _tcp(cls, v: str) -> str:
        host, sep, port = v.removeprefix("tcp://").rpartition(":")
        if not (v.startswith("tcp://") and sep and host and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{v!r} is not tcp://HOST:PORT with a port in 1..65535")
        return v

    def endpoint(self) -> tuple[str, int]:
        """(host, port) the trainer binds; "*" is every interface."""
        host, _, port = self.address.removeprefix("tcp://").rpartition(":")
        return ("0.0.0.0" if host == "*" else host), int(port)


class AuthConfig(Strict):
    """Keys of processes that listen beyond loopback (transports/auth.py says which file is whose)."""

    keys_dir: Path | None = Field(None, description="from `composer-prime keys make --out DIR`; `rl` uses "
                                                     "<output_dir>/keys when needed")


class WeightBroadcastConfig(Strict):
    """How new weights reach inference. `filesystem`: a shared `weights/` directory and a POST to
    /update_weights. `shardcast`: the trainer runs a SHARDCAST origin; inference nodes download,
    verify and load each step themselves (through relays or straight from the origin)."""

    type: Literal["filesystem", "shardcast"] = Field("filesystem", description="how weights travel (see above)")
    keep_last: int = Field(3, ge=1, description="steps kept on disk (and listed by the origin); older ones are pruned")
    host: str = Field("127.0.0.1", description="shardcast: the origin's listening address (trainer side)")
    port: Port = Field(8100, description="shardcast: the origin's port; local relays take the next ports")
    shard_size: int = Field(50_000_000, ge=1, description="shardcast: bytes per shard (SHARDCAST's default)")
    delta: bool = Field(True, description="shardcast: also publish step N as a compressed XOR against step N-1 "
                                          "when that is smaller")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="dtype of the published weights "
                                                                              "(auto: the trainer's compute_dtype)")
    key_path: Path | None = Field(None, description="shardcast: ed25519 signing key; default "
                                                    "<output_dir>/keys/trainer.ed25519")
    servers: CommaList = Field(default_factory=list, description="shardcast, inference side: relays and/or the "
                                                                 'origin, e.g. ["http://relay:8200"]')
    public_key: str = Field("", description="shardcast, inference side: the trainer's ed25519 public key, hex or "
                                            "the file holding it (keys/trainer.ed25519.pub); nothing unsigned by it "
                                            "is loaded")


class RelayConfig(Strict):
    """`uv run relay`: mirror SHARDCAST upstreams and re-serve them."""

    upstream: CommaList = Field(min_length=1, description="origin and/or relay URLs to mirror, e.g. "
                                                          "http://trainer-host:8100 (comma-separated)")
    public_key: str = Field(min_length=1, description="the trainer's ed25519 public key, hex or the file holding "
                                                      "it (keys/trainer.ed25519.pub); unsigned steps are never served")
    host: str = Field("127.0.0.1", description="listening address")
    port: Port = Field(8200, description="listening port")
    data_dir: Path = Field(Path("outputs/relay"), description="where mirrored steps are kept")
    keep_last: int = Field(3, ge=1, description="steps kept; older ones are pruned")
    poll_wait_s: float = Field(30.0, gt=0, description="long-poll wait on upstream for a new step, in seconds")

    def binds(self) -> list[tuple[str, str, int]]:
        """(key, host, port) for every port this process listens on."""
        return [("port", self.host, self.port)]
