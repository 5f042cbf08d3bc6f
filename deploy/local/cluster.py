"""The emulated cluster whole: its API server, the binder, the node lifecycle controller and one agent
per node, started together and stopped together (every container with them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from kubernetes import client as k8s
from local_cluster.agent import NodeAgent, NodeSpec
from local_cluster.apiserver import ApiServer
from local_cluster.binder import Binder
from local_cluster.images import LocalImage
from local_cluster.lifecycle import NodeLifecycle
from local_cluster.network import Bridge, ClusterNames, PodNetwork


class EmulatedCluster:
    """`nodes` run their pods under `root` (a directory per pod); `images` by repository."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        images: Mapping[str, LocalImage],
        root: Path,
        *,
        node_grace_s: float = 40.0,
        report_every_s: float = 1.0,
        pod_network: bool | None = None,
    ):
        """`pod_network`: each pod in a network namespace of its own on the cluster's bridge (the
        default where this machine allows it: root); else pods share this machine's network."""
        self.network: PodNetwork | None = None
        if pod_network if pod_network is not None else Bridge.possible():
            root.mkdir(parents=True, exist_ok=True)
            self.network = PodNetwork(Bridge().create(), ClusterNames(root / "hosts"))
        self.server = ApiServer(keeps_requests=False)
        configuration = k8s.Configuration()
        configuration.host = self.server.url
        self.api = k8s.CoreV1Api(k8s.ApiClient(configuration))
        self.images, self.root, self.report_every_s = images, root, report_every_s
        self.agents = {spec.name: self._agent(spec) for spec in nodes}
        self.binder = Binder(self.api)
        self.lifecycle = NodeLifecycle(self.api, grace_s=node_grace_s)

    def _agent(self, spec: NodeSpec) -> NodeAgent:
        return NodeAgent(
            self.api,
            spec,
            self.images,
            self.root / spec.name,
            report_every_s=self.report_every_s,
            network=self.network,
        )

    def add_node(self, spec: NodeSpec) -> NodeAgent:
        """A node joins the running cluster (a machine added, or one that replaces a lost machine): its
        agent registers it and runs the pods bound to it from then on."""
        if spec.name in self.agents:
            raise ValueError(f"node {spec.name} exists already")
        agent = self._agent(spec)
        self.agents[spec.name] = agent
        agent.register().start()
        return agent

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def gateway(self) -> str:
        """The address pods reach this machine at (what serves them listens there): the bridge's, or
        loopback when pods share this machine's network."""
        return self.network.bridge.gateway if self.network else "127.0.0.1"

    def add_namespace(self, name: str) -> None:
        """kmock cannot serve namespaces: the ones that exist are the emulator's (apiserver.py)."""
        self.server.emulator.namespaces[name] = {"metadata": {"name": name}}

    def evict(self, name: str, namespace: str, reason: str = "EvictionByEvictionAPI") -> None:
        """What the Eviction API (kmock has no such subresource) or a node-pressure eviction does: the
        pod's `DisruptionTarget` condition (True, `reason`), then its deletion with its grace period, so
        its container gets SIGTERM and, after the grace period, SIGKILL."""
        pod = self.api.read_namespaced_pod(name, namespace)
        kept = [c.to_dict() for c in (pod.status.conditions or []) if c.type != "DisruptionTarget"]
        target = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": "Eviction API: evicting" if reason == "EvictionByEvictionAPI" else "evicted",
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self.api.patch_namespaced_pod_status(name, namespace, {"status": {"conditions": [*kept, target]}})
        self.api.delete_namespaced_pod(name, namespace)

    def start(self) -> EmulatedCluster:
        for agent in self.agents.values():
            agent.register().start()
        self.binder.start()
        self.lifecycle.start()
        return self

    def stop(self) -> None:
        self.binder.stop()
        self.lifecycle.stop()
        for agent in self.agents.values():
            agent.stop()
        self.server.stop()
        if self.network is not None:
            self.network.bridge.remove()

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
