"""A network of its own for each component, so the suite can cut one component off from all others.

Every component (and every process it starts: the API's workers, a scheduler's training workers)
runs in a network namespace of its own, joined to the suite's namespace by a veth pair on one
bridge. The suite's namespace holds the bridge's address, the fault links to PostgreSQL and Redis
listen there, and the components reach each other by their own addresses: nothing travels over a
shared loopback. `cut(name)` takes the component's port on the bridge down, so its packets are
dropped both ways, as in a real partition (no reset: TCP's own timers and the clients' bounds find
it); `heal(name)` brings it back, and connections whose timers have not run out carry on.

Needs root (namespaces, links); `Network.possible()` says whether this machine allows it.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

NETNS = Path("/run/netns")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Member:
    namespace: str
    port: str  # the bridge's end of its veth pair, in the suite's namespace
    address: str


class Network:
    """A bridge and one namespace per name; `create()` first, `remove()` undoes everything."""

    def __init__(self, names: Iterable[str]):
        tag = secrets.token_hex(3)  # interface names have room for 15 characters
        self.bridge = f"gyb{tag}"
        subnet = _free_subnet()
        hosts = iter(subnet.hosts())
        self.gateway = str(next(hosts))
        self.prefix = subnet.prefixlen
        self.members = {
            name: Member(f"gyn{tag}{i}", f"gyv{tag}{i}", str(next(hosts))) for i, name in enumerate(names)
        }
        self.cut_off: set[str] = set()

    @staticmethod
    def possible() -> bool:
        return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nsenter") is not None

    def create(self) -> Network:
        try:
            # Frames between the members are bridged, not routed: the host's firewall (which may drop
            # what it forwards) has no say in them.
            _ip("link", "add", self.bridge, "type", "bridge", "nf_call_iptables", "0")
            _ip("addr", "add", f"{self.gateway}/{self.prefix}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for member in self.members.values():
                ns = member.namespace
                _ip("netns", "add", ns)
                _ip("link", "add", member.port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", member.port, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{member.address}/{self.prefix}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", self.gateway)
        except Exception:
            self.remove()
            raise
        return self

    def argv(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside `name`'s namespace (only the network namespace: mounts stay shared)."""
        return ["nsenter", f"--net={NETNS / self.members[name].namespace}", "--", *argv]

    def address(self, name: str) -> str:
        return self.members[name].address

    def cut(self, name: str) -> None:
        """Drop every packet to and from `name`, until `heal`."""
        _ip("link", "set", self.members[name].port, "down")
        self.cut_off.add(name)

    def heal(self, name: str) -> None:
        _ip("link", "set", self.members[name].port, "up")
        self.cut_off.discard(name)

    def heal_all(self) -> None:
        for name in sorted(self.cut_off):
            self.heal(name)

    def remove(self) -> None:
        """Delete the namespaces (their veth pairs go with them) and the bridge, whatever exists."""
        for member in self.members.values():
            subprocess.run(["ip", "netns", "del", member.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no interface of this namespace has an address in."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    taken = {ipaddress.ip_interface(field.split()[3]).network for field in shown.splitlines() if field}
    candidates = list(ipaddress.ip_network("10.200.0.0/13").subnets(new_prefix=24))
    for subnet in secrets.SystemRandom().sample(candidates, 64):
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError("no free /24 in 10.200.0.0/13 for the fault suite's bridge")
