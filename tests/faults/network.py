"""A network of its own for each component, so the suite can cut one component off from all others.

Every component (and every process it starts: the API's workers, a scheduler's training workers)
runs in a network namespace of its own on one bridge (the emulated cluster's `Bridge`,
deploy/local/network.py). The suite's namespace holds the bridge's address, the fault links to
PostgreSQL and Redis listen there, and the components reach each other by their own addresses:
nothing travels over a shared loopback. `cut(name)` takes the component's port on the bridge down, so
its packets are dropped both ways, as in a real partition (no reset: TCP's own timers and the clients'
bounds find it); `heal(name)` brings it back, and connections whose timers have not run out carry on.

Needs root (namespaces, links); `Network.possible()` says whether this machine allows it.
"""

from __future__ import annotations

from collections.abc import Iterable

from local_cluster.network import Attachment, Bridge


class Network:
    """A bridge and one namespace per name; `create()` first, `remove()` undoes everything."""

    possible = staticmethod(Bridge.possible)

    def __init__(self, names: Iterable[str]):
        self.bridge = Bridge()
        self.names = list(names)
        self.members: dict[str, Attachment] = {}
        self.cut_off: set[str] = set()

    @property
    def gateway(self) -> str:
        return self.bridge.gateway

    def create(self) -> Network:
        try:
            self.bridge.create()
            for name in self.names:
                self.members[name] = self.bridge.attach()
        except Exception:
            self.remove()
            raise
        return self

    def argv(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside `name`'s namespace (only the network namespace: mounts stay shared)."""
        return self.bridge.argv(self.members[name], argv)

    def address(self, name: str) -> str:
        return self.members[name].address

    def cut(self, name: str) -> None:
        """Drop every packet to and from `name`, until `heal`."""
        self.bridge.cut(self.members[name])
        self.cut_off.add(name)

    def heal(self, name: str) -> None:
        self.bridge.heal(self.members[name])
        self.cut_off.discard(name)

    def heal_all(self) -> None:
        for name in sorted(self.cut_off):
            self.heal(name)

    def remove(self) -> None:
        """Delete the namespaces (their veth pairs go with them) and the bridge, whatever exists."""
        for attachment in self.members.values():
            self.bridge.detach(attachment)
        self.bridge.remove()
