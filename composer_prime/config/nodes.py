"""`[trainer.nodes]`: one trainer across several machines, `nproc` ranks on each.

`trainer` is started on every node with the same config and its own `rank`; torchrun's static
rendezvous meets at node 0's `master` (its TCPStore), then FSDP2 shards over all
`count * nproc` ranks. Node 0's first rank receives the batches and publishes the weights, so the
orchestrator and inference talk to node 0 only. Checkpoints are written by every rank (sharded):
`output_dir` must be the same shared directory on every node (a run on machines that do not share
it is refused at start, in one line, not left waiting in a collective).

torchrun's store and gloo's sockets have no authentication: a `master` beyond loopback needs
`trusted_network`, saying the network between the nodes is private (as with DiLoCo's islands).
`host` is this node's address on that network: gloo (and NCCL's bootstrap) use the interface
holding it, rather than whatever the machine's host name resolves to.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from composer_prime.config.base import FieldError, Strict
from composer_prime.transports.auth import is_loopback


class NodesConfig(Strict):
    """The machines one trainer spans (torchrun --nnodes, --node-rank, --master-addr/--master-port)."""

    count: int = Field(1, ge=1, description="machines the trainer spans; start `trainer` on each with its `rank`")
    rank: int = Field(0, ge=0, description="this machine's place, 0..count-1; node 0 receives batches and publishes")
    master: str = Field("127.0.0.1:29500", description="host:port of node 0's rendezvous, reachable from every node "
                                                       "(used when count > 1; one node picks a free loopback port)")
    host: str | None = Field(None, description="this node's address on the nodes' network: gloo and NCCL use the "
                                               "interface holding it (None: the host name's address)")
    join_timeout_s: int = Field(600, ge=1, description="how long a node waits for all the others at the rendezvous "
                                                     "before it stops, naming the master")
    trusted_network: bool = Field(False, description="the rendezvous store and gloo have no authentication: a master "
                                                     "beyond loopback needs this set, saying the network is private")

    @model_validator(mode="after")
    def _check(self) -> "NodesConfig":
        if self.rank >= self.count:
            raise FieldError("rank", f"{self.rank} is not below count = {self.count}")
        host, sep, port = self.master.rpartition(":")
        if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
            raise FieldError("master", f"{self.master!r} is not host:port")
        if self.count > 1 and not is_loopback(host) and not self.trusted_network:
            raise FieldError("master", f"{host} is beyond loopback, and the rendezvous store there would accept anyone: "
                                       "set trainer.nodes.trusted_network = true once the nodes' network is private")
        return self

    def address(self) -> tuple[str, int]:
        host, _, port = self.master.rpartition(":")
        return host, int(port)
