"""The emulated cluster's pod network: a bridge, a network namespace per pod on it, and the cluster's
names.

The bridge holds the gateway address, where whatever serves the pods listens (the control plane, an
object store); each pod gets an address of the bridge's subnet and a veth pair, so pods reach each
other and the gateway by address and nothing else of this machine (its loopback is not theirs). Names
resolve as the cluster's DNS would resolve a headless Service's: `hosts` is one file, every pod's
`/etc/hosts` (bind-mounted by `container.py`), rewritten in place as pods come and go, with each pod's
`<hostname>.<subdomain>.<namespace>.svc.<domain>` and its shorter forms. Every other name fails at once,
as a cluster's DNS answers for a name it does not have: each pod's `/etc/resolv.conf` names a server on
its own loopback, where none listens. This machine's resolver, which pods cannot reach, made each
lookup wait out its timeouts (10 s: gloo's reverse lookups held every rendezvous 10 to 20 s).

Needs root and iproute2 (`BridgeNetwork.possible()`).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

NETNS = Path("/run/netns")


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def free_subnet(within: str = "10.200.0.0/13") -> ipaddress.IPv4Network:
    """A /24 of `within` that no interface of this namespace has an address in."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    taken = {ipaddress.ip_interface(line.split()[3]).network for line in shown.splitlines() if line}
    candidates = list(ipaddress.ip_network(within).subnets(new_prefix=24))
    for subnet in secrets.SystemRandom().sample(candidates, min(64, len(candidates))):
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError(f"no free /24 in {within} for a bridge")


@dataclass(frozen=True)
class Attachment:
    namespace: str  # its network namespace, under /run/netns
    port: str  # the bridge's end of its veth pair
    address: str


class Bridge:
    """A bridge with the gateway address, and namespaces attached to it and detached at will."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)  # interface names have room for 15 characters
        self.name = f"gyb{self.tag}"
        self.mac = "02:" + ":".join(secrets.token_hex(5)[i : i + 2] for i in range(0, 10, 2))  # local
        subnet = free_subnet()
        self._free = [str(host) for host in subnet.hosts()]
        self.gateway = self._free.pop(0)
        self.prefix = subnet.prefixlen
        self._next = 0
        self._lock = threading.Lock()

    @staticmethod
    def possible() -> bool:
        return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nsenter") is not None

    def create(self) -> Bridge:
        # Frames between the members are bridged, not routed: the host's firewall has no say in them.
        # Its own address, set once: a bridge otherwise takes the lowest of its ports' addresses, so a
        # pod's namespace detached took the gateway's address with it, and every other pod's cached
        # neighbour entry for the gateway led nowhere until it expired (connections to this machine
        # stalled for 30 to 50 s: a fault campaign's checkpoint uploads waited that long).
        ip("link", "add", self.name, "address", self.mac, "type", "bridge", "nf_call_iptables", "0")
        ip("addr", "add", f"{self.gateway}/{self.prefix}", "dev", self.name)
        ip("link", "set", self.name, "up")
        return self

    def attach(self) -> Attachment:
        """A new namespace on the bridge, with an address of its own and the gateway as its route."""
        with self._lock:
            if not self._free:
                raise RuntimeError(f"bridge {self.name}: no address left")
            address, number = self._free.pop(0), self._next
            self._next += 1
        made = Attachment(f"gyn{self.tag}{number}", f"gyv{self.tag}{number}", address)
        try:
            ip("netns", "add", made.namespace)
            ip("link", "add", made.port, "type", "veth", "peer", "name", "eth0", "netns", made.namespace)
            ip("link", "set", made.port, "master", self.name, "up")
            ip("-n", made.namespace, "addr", "add", f"{address}/{self.prefix}", "dev", "eth0")
            ip("-n", made.namespace, "link", "set", "eth0", "up")
            ip("-n", made.namespace, "link", "set", "lo", "up")
            ip("-n", made.namespace, "route", "add", "default", "via", self.gateway)
        except Exception:
            self.detach(made)
            raise
        return made

    def detach(self, attachment: Attachment) -> None:
        """Its namespace deleted (the veth pair goes with it); its address free again."""
        subprocess.run(["ip", "netns", "del", attachment.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", attachment.port], capture_output=True)
        with self._lock:
            self._free.append(attachment.address)

    def argv(self, attachment: Attachment, argv: list[str]) -> list[str]:
        """`argv` run in the namespace (the network namespace only)."""
        return ["nsenter", f"--net={NETNS / attachment.namespace}", "--", *argv]

    def cut(self, attachment: Attachment) -> None:
        """Drop every packet to and from the namespace (no reset), until `heal`."""
        ip("link", "set", attachment.port, "down")

    def heal(self, attachment: Attachment) -> None:
        ip("link", "set", attachment.port, "up")

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)


class ClusterNames:
    """The cluster's names as one hosts file, rewritten in place (bind mounts keep its inode)."""

    def __init__(self, path: Path, domain: str = "cluster.local"):
        self.path, self.domain = path, domain
        self._entries: dict[str, tuple[str, list[str]]] = {}  # pod uid -> (address, names)
        self._lock = threading.Lock()
        self.path.write_text(self._render())
        # Every pod's /etc/resolv.conf: no server answers on a pod's loopback, so a name that is not
        # the cluster's fails at once (refused) instead of waiting for a resolver it cannot reach.
        self.resolver = path.with_name("resolv.conf")
        self.resolver.write_text("nameserver 127.0.0.1\n")

    def add(self, uid: str, address: str, hostname: str, subdomain: str | None, namespace: str) -> None:
        names = [hostname]
        if subdomain:
            service = f"{hostname}.{subdomain}.{namespace}.svc"
            names = [f"{service}.{self.domain}", service, f"{hostname}.{subdomain}", hostname]
        with self._lock:
            self._entries[uid] = (address, names)
            self._write()

    def remove(self, uid: str) -> None:
        with self._lock:
            if self._entries.pop(uid, None) is not None:
                self._write()

    def _render(self) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{address} {' '.join(names)}" for address, names in self._entries.values()]
        return "\n".join(lines) + "\n"

    def _write(self) -> None:
        with self.path.open("r+") as hosts:
            hosts.truncate(0)
            hosts.write(self._render())


@dataclass(frozen=True)
class PodNetwork:
    """What the node agents share: the bridge the pods attach to, and the cluster's names."""

    bridge: Bridge
    names: ClusterNames
