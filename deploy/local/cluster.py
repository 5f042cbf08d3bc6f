"""The emulated cluster whole: its API server, the binder, the node lifecycle controller and one agent
per node, started together and stopped together (every container with them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from kubernetes import client as k8s
from local_cluster.agent import NodeAgent, NodeSpec
from local_cluster.apiserver import ApiServer
from local_cluster.binder import Binder
from local_cluster.images import LocalImage
from local_cluster.lifecycle import NodeLifecycle


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
    ):
        self.server = ApiServer()
        configuration = k8s.Configuration()
        configuration.host = self.server.url
        self.api = k8s.CoreV1Api(k8s.ApiClient(configuration))
        self.agents = {
            spec.name: NodeAgent(self.api, spec, images, root / spec.name, report_every_s=report_every_s)
            for spec in nodes
        }
        self.binder = Binder(self.api)
        self.lifecycle = NodeLifecycle(self.api, grace_s=node_grace_s)

    @property
    def url(self) -> str:
        return self.server.url

    def add_namespace(self, name: str) -> None:
        """kmock cannot serve namespaces: the ones that exist are the emulator's (apiserver.py)."""
        self.server.emulator.namespaces[name] = {"metadata": {"name": name}}

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

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
