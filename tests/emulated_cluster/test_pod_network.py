"""The emulated cluster's pod network (local_cluster.network): every pod in a network namespace of its
own on the cluster's bridge, reaching the others by their headless Service's names and this machine
only at the bridge's gateway."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_cluster.agent import NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.images import python_image
from local_cluster.network import Bridge, ip
from servers import open_directory, wait_until

from .test_agent import IMAGE, phase, pod

pytestmark = pytest.mark.requires(Bridge.possible(), "network namespaces need root and iproute2")

SERVE = """
import socket, sys
server = socket.create_server(("0.0.0.0", 29500))
connection, _ = server.accept()
open(sys.argv[1], "w").write(connection.recv(100).decode())
"""
CALL = """
import socket, sys, time
for _ in range(600):  # until rank 0 listens, as a rendezvous retries
    try:
        socket.create_connection((sys.argv[1], 29500), timeout=1).sendall(sys.argv[2].encode())
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit(1)
"""
PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("reached")
except OSError as error:
    print(type(error).__name__)
"""
LOOKUP = """
import socket, time
began = time.monotonic()
try:
    socket.getaddrinfo("outside.example", 80)
    print("resolved")
except OSError as error:
    print(type(error).__name__, round(time.monotonic() - began, 1))
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    nodes = [NodeSpec("node-a"), NodeSpec("node-b")]
    with EmulatedCluster(nodes, {IMAGE: python_image()}, tmp_path / "nodes", pod_network=True) as made:
        made.add_namespace("team-a")
        yield made


@pytest.fixture
def shared() -> Iterator[Path]:
    with open_directory() as directory:
        yield directory


@contextlib.contextmanager
def accepting(host: str) -> Iterator[tuple[str, int]]:
    """A TCP server on `host` that accepts (and closes) every connection until the block ends; its
    address."""
    server = socket.create_server((host, 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[:2]
    finally:
        stop.set()
        server.close()


def python_pod(cluster: EmulatedCluster, name: str, code: str, *args: str, **spec: object) -> None:
    container = {"name": "worker", "image": f"{IMAGE}:1", "command": ["python", "-c", code, *args]}
    body = {
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"containers": [container], "restartPolicy": "Never", **spec},
    }
    cluster.api.create_namespaced_pod("team-a", body)


def test_gangs_meet_at_their_service_names_each_on_its_own_port_space(
    cluster: EmulatedCluster, shared: Path
) -> None:
    for gang in ("g1", "g2"):  # the same port in both: each pod has its own
        rank0 = f"{gang}-r0.{gang}.team-a.svc.cluster.local"
        python_pod(cluster, f"{gang}-r0", SERVE, str(shared / gang), hostname=f"{gang}-r0", subdomain=gang)
        python_pod(cluster, f"{gang}-r1", CALL, rank0, f"hello {gang}", hostname=f"{gang}-r1", subdomain=gang)
    for name in ("g1-r0", "g1-r1", "g2-r0", "g2-r1"):
        wait_until(lambda name=name: phase(cluster, name) == "Succeeded", timeout_s=60, what=f"{name} done")
    assert (shared / "g1").read_text() == "hello g1" and (shared / "g2").read_text() == "hello g2"
    addresses = {(pod(cluster, n) or {})["status"]["podIP"] for n in ("g1-r0", "g1-r1", "g2-r0", "g2-r1")}
    assert len(addresses) == 4 and cluster.gateway not in addresses


def test_a_pod_reaches_this_machine_at_the_gateway_and_not_at_its_loopback(
    cluster: EmulatedCluster, shared: Path
) -> None:
    with accepting(cluster.gateway) as at_gateway, accepting("127.0.0.1") as at_loopback:
        for name, (host, port) in {"gw": at_gateway, "lo": at_loopback}.items():
            python_pod(
                cluster,
                name,
                f"import sys; sys.stdout = open('{shared}/{name}.out', 'w')\n" + PROBE,
                host,
                str(port),
            )
        # Nor does it reach this machine's resolver: a name that is not the cluster's fails at once
        # (a lookup waited 10 s for it before, and held every gloo rendezvous as long).
        python_pod(cluster, "dns", f"import sys; sys.stdout = open('{shared}/dns.out', 'w')\n" + LOOKUP)
        for name in ("gw", "lo", "dns"):
            wait_until(
                lambda name=name: phase(cluster, name) == "Succeeded", timeout_s=60, what=f"{name} done"
            )
        assert (shared / "gw.out").read_text().strip() == "reached"
        assert (shared / "lo.out").read_text().strip() == "ConnectionRefusedError"  # its own loopback
        failed, seconds = (shared / "dns.out").read_text().split()
        assert failed == "gaierror" and float(seconds) < 2


KNOCK = """
import socket, sys, time
while True:  # each second or so, whether the gateway's server answers: one line per try
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5).close()
        seen = "reached"
    except OSError as error:
        seen = type(error).__name__
    with open(sys.argv[3], "a") as out:
        out.write(seen + "\\n")
    time.sleep(0.05)
"""


def test_a_node_cut_from_every_network_runs_its_pods_on_reaching_nothing_till_healed(
    cluster: EmulatedCluster, shared: Path
) -> None:
    """Partition (b): the machine and its pods cut from everything (the control plane, the store, the
    gang's other nodes) while the other node's pods reach what they reached."""

    def seen(node: str) -> list[str]:
        path = shared / node
        return path.read_text().split() if path.exists() else []

    with accepting(cluster.gateway) as (host, port):
        for node in ("a", "b"):
            knock = (KNOCK, host, str(port), str(shared / node))
            python_pod(cluster, f"on-{node}", *knock, nodeName=f"node-{node}")
            wait_until(lambda node=node: seen(node)[-1:] == ["reached"], timeout_s=60, what=f"on-{node} on")
        cluster.agents["node-a"].partition(pods_too=True)
        wait_until(lambda: seen("a")[-1:] == ["TimeoutError"], what="on-a cut off (its packets dropped)")
        before = len(seen("b"))
        wait_until(lambda: len(seen("b")) > before + 1, what="on-b trying again")
        assert seen("b")[before + 1 :] == ["reached"] * len(seen("b")[before + 1 :])
        assert phase(cluster, "on-a") == "Running"  # it runs on, unreported
        cluster.agents["node-a"].heal()
        wait_until(lambda: seen("a")[-1:] == ["reached"], what="on-a reaching again")


def test_a_namespace_detached_leaves_the_others_reaching_the_gateway_at_once() -> None:
    """A bridge's address was its lowest port's: the namespace whose port lent it took the gateway's
    address away when it was detached, and the others' cached neighbour entry for the gateway led
    nowhere for 30 s or more. Forced here: the port detached has the lowest address there can be."""
    bridge = Bridge().create()
    try:
        stays, goes = bridge.attach(), bridge.attach()
        ip("link", "set", goes.port, "address", "02:00:00:00:00:01")  # the lowest of any port
        with accepting(bridge.gateway) as (host, port):

            def probe() -> str:
                argv = bridge.argv(stays, [sys.executable, "-c", PROBE, host, str(port)])
                return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()

            assert probe() == "reached"  # the namespace has the gateway's neighbour entry now
            bridge.detach(goes)
            assert Path(f"/sys/class/net/{bridge.name}/address").read_text().strip() == bridge.mac
            assert probe() == "reached"  # within PROBE's 2 s, on the entry it had
        bridge.detach(stays)
    finally:
        bridge.remove()
