"""The fault suite's network (`network.py`): each component in a namespace of its own reaches the bridge
and the others; a cut one reaches nothing and is reached by nothing, while the rest carry on; healed,
it is back. Connections are probed with short timeouts: a cut link drops, it never answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from servers import wait_until

from .network import Network

pytestmark = pytest.mark.requires(Network.possible(), "network namespaces need root and iproute2")

PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
    print("reached")
except OSError as error:
    print(type(error).__name__)
"""

SERVE = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.fixture
def network() -> Iterator[Network]:
    made = Network(["a", "b"]).create()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def listener(network: Network) -> Iterator[int]:
    """A TCP server on the bridge's address, in the suite's own namespace, accepting forever."""
    server = socket.create_server((network.gateway, 0))
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()


def probe(network: Network, member: str, host: str, port: int) -> str:
    argv = network.argv(member, [sys.executable, "-c", PROBE, host, str(port)])
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def test_a_cut_component_reaches_nothing_while_the_others_carry_on(network: Network, listener: int) -> None:
    assert probe(network, "a", network.gateway, listener) == "reached"
    assert probe(network, "b", network.gateway, listener) == "reached"

    network.cut("a")
    assert probe(network, "a", network.gateway, listener) == "TimeoutError"  # dropped, not refused
    assert probe(network, "b", network.gateway, listener) == "reached"

    network.heal("a")
    # Its neighbour entry for the gateway failed while cut: the first tries may answer "unreachable"
    # until it resolves again, as on a real link brought back
    wait_until(lambda: probe(network, "a", network.gateway, listener) == "reached", 15, 0.2, what="a healed")
    assert network.cut_off == set()


def test_components_reach_each_other_by_address_and_not_through_loopback(network: Network) -> None:
    server = subprocess.Popen(
        network.argv("b", [sys.executable, "-c", SERVE, network.address("b")]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())  # printed once it listens
        assert probe(network, "a", network.address("b"), port) == "reached"
        assert probe(network, "a", "127.0.0.1", port) == "ConnectionRefusedError"  # a's own loopback
        network.cut("b")
        assert probe(network, "a", network.address("b"), port) == "TimeoutError"
    finally:
        server.kill()
        server.wait()


def test_removing_leaves_no_namespace_or_link_behind() -> None:
    network = Network(["a"]).create()
    network.remove()
    shown = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert network.bridge.name not in shown and network.members["a"].port not in shown
    assert network.members["a"].namespace not in namespaces
