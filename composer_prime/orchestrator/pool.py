"""The inference nodes a run samples from: a pool that nodes join and leave.

Every request goes to the next live node in turn (round-robin over the pool as it is now). A
**trusted** node is one of the run's own inference servers (`inference_urls`): the run depends on
it, so when it cannot be reached the orchestrator stops with one line, as before. An untrusted
node (a volunteer's, which joins through the pool at run time) that cannot be reached, or that
the validator ejects, leaves the pool; its requests go to the others. Versions are read from the
trusted nodes only: they decide when a policy is served.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Node:
    url: str
    trusted: bool


class NoNodes(RuntimeError):
    """Every node has left the pool."""


class NodePool:
    def __init__(self, trusted: list[str]) -> None:
        self.nodes: dict[str, Node] = {u: Node(u, True) for u in trusted}
        self.left: dict[str, str] = {}  # url -> why it left
        self._turn = 0

    def join(self, url: str) -> None:
        """An untrusted node joins (again, if it had left)."""
        self.left.pop(url, None)
        self.nodes.setdefault(url, Node(url, False))

    def leave(self, url: str, why: str) -> None:
        """A node leaves (a trusted node cannot: the run depends on it)."""
        if url in self.nodes and not self.nodes[url].trusted:
            del self.nodes[url]
            self.left[url] = why

    def pick(self) -> Node:
        """The next live node, in turn."""
        if not self.nodes:
            raise NoNodes(f"no inference node left ({', '.join(f'{u}: {w}' for u, w in self.left.items())})")
        live = list(self.nodes.values())
        node = live[self._turn % len(live)]
        self._turn += 1
        return node

    def trusted(self) -> list[str]:
        return [n.url for n in self.nodes.values() if n.trusted]
