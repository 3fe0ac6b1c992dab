"""The inference nodes a run samples from: a pool that nodes join and leave, and the sources of them.

A `Node` generates a group of completions of one prompt (`complete`). A **trusted** node is one of
the run's own inference servers (`inference_urls`, an `HttpNode`: HTTP to its token route): the run
depends on it, so when it cannot be reached the orchestrator stops with one line. An untrusted
node (a volunteer's: volunteer/node.py) joins at run time through a node source; when it cannot be
reached, or is ejected, it leaves the pool and its requests go to the others. A node that cannot
answer one request (`NodeFailed`: a lease lost, a submission no trusted server can check) hands it
to the next node. Every request goes to the next node in turn (round-robin over the pool as it is
now); versions are read from the trusted nodes only: they decide when a policy is served.

A node source (`NODE_SOURCES` entry points, pyproject.toml) brings nodes into the pool while the
run goes: the volunteers' pool is one (volunteer/pool.py). The orchestrator starts, stops and reads
the metrics of each active source, and names none: a source is one module and a registration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from composer_prime.config.models import OrchestratorConfig
from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.audit import AuditAnswer, AuditRequest
from composer_prime.contract.inference import Completion, completions
from composer_prime.utils import plugins

NODE_SOURCES = "composer_prime.node_sources"  # the entry-point group node sources register in


class NodeFailed(RuntimeError):
    """This node could not answer this request: the next node takes it."""


class NoNodes(RuntimeError):
    """Every node has left the pool."""


class Node:
    """Subclasses set `name` and `trusted`, and generate n completions of a prompt (choice i with seed + i)."""

    name: str
    trusted: bool

    async def complete(self, prompt_ids: list[int], sampling: SamplingParams, n: int) -> list[Completion]:
        raise NotImplementedError


class HttpNode(Node):
    """An inference server of ours: its token route, through the client's `post` (retries and all);
    trusted when it is one of the run's own (`inference_urls`)."""

    def __init__(self, url: str, model: str, post: Callable[[str, dict, str], Awaitable[dict[str, Any]]],
                 trusted: bool = True) -> None:
        self.name, self.model, self._post, self.trusted = url, model, post, trusted

    async def complete(self, prompt_ids: list[int], sampling: SamplingParams, n: int) -> list[Completion]:
        request = {"model": self.model, "token_ids": prompt_ids, "n": n, "sampling_params": sampling.model_dump(mode="json")}
        return completions(await self._post("/inference/v1/generate", request, self.name))


class NodePool:
    def __init__(self, trusted: list[Node]) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in trusted}
        self.left: dict[str, str] = {}  # name -> why it left
        self._turn = 0

    def join(self, node: Node) -> None:
        """An untrusted node joins (again, if it had left)."""
        self.left.pop(node.name, None)
        self.nodes.setdefault(node.name, node)

    def leave(self, name: str, why: str) -> None:
        """A node leaves (a trusted node cannot: the run depends on it)."""
        if name in self.nodes and not self.nodes[name].trusted:
            del self.nodes[name]
            self.left[name] = why

    def pick(self, trusted: bool = False) -> Node:
        """The next live node (a trusted one, when asked), in turn."""
        live = [n for n in self.nodes.values() if n.trusted or not trusted]
        if not live:
            raise NoNodes(f"no inference node left ({', '.join(f'{u}: {w}' for u, w in self.left.items())})")
        node = live[self._turn % len(live)]
        self._turn += 1
        return node

    def trusted(self) -> list[str]:
        return [n.name for n in self.nodes.values() if n.trusted]


Audit = Callable[[AuditRequest], Awaitable[AuditAnswer | None]]  # a trusted server's measurements; None: not at that version


class NodeSource(Protocol):
    """What a node source registered under NODE_SOURCES offers the orchestrator."""

    @classmethod
    def active(cls, cfg: OrchestratorConfig) -> bool: ...

    @classmethod
    def build(cls, cfg: OrchestratorConfig, pool: NodePool, audit: Audit, served: Callable[[], int]) -> NodeSource: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def in_batch(self, nodes: list[list[str]]) -> dict[str, int]:
        """Per source-specific key, the batch's rollouts that its nodes sampled a turn of (`nodes`: each rollout's)."""
        ...

    def waiting_for(self) -> str | None:
        """What this source still waits for before the run's first step, in words (None: nothing)."""
        ...


def make_sources(cfg: OrchestratorConfig, pool: NodePool, audit: Audit, served: Callable[[], int]) -> list[NodeSource]:
    """The active node sources, each given the pool its nodes join, the trusted servers' audit and the
    weight version they serve now."""
    return [cls.build(cfg, pool, audit, served) for cls in plugins.load(NODE_SOURCES).values() if cls.active(cfg)]
