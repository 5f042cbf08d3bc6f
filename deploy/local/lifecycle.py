"""The node lifecycle controller's part in the emulated cluster: a node whose agent has not reported
within `grace_s` (its Ready condition's lastHeartbeatTime) is marked Ready `Unknown`, reason
`NodeStatusUnknown`, as Kubernetes' node controller does after its node-monitor grace period. Its
pods are left as they are: what became of them is unknown, and only their node's return or its
removal tells. Once a node is removed (`kubectl delete node`, an operator's word that the machine is
gone), its pods are force-deleted, as the pod garbage collector does: their finalizers dropped, the
objects gone."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from local_cluster.periodic import Periodic

log = logging.getLogger(__name__)


def silent_for(node: dict[str, Any], now: datetime.datetime) -> float | None:
    """Seconds since the node's agent last reported it Ready; None unless it is Ready (True)."""
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            beat = condition.get("lastHeartbeatTime")
            if beat is None:
                return None
            return (now - datetime.datetime.fromisoformat(beat.replace("Z", "+00:00"))).total_seconds()
    return None


class NodeLifecycle:
    def __init__(self, api: k8s.CoreV1Api, grace_s: float = 40.0, every_s: float = 1.0):
        """`every_s`: a pass lists every node and pod (Kubernetes' node controller looks every 5 s, its
        pod garbage collector every 20 s; a node's grace here may be as short as 5 s)."""
        self.api, self.grace_s = api, grace_s
        self._loop = Periodic("node-lifecycle", every_s, self.pass_once)

    def pass_once(self) -> None:
        nodes = json.loads(self.api.list_node(_preload_content=False).data)["items"]
        self.mark_silent(nodes)
        self.collect_orphans({n["metadata"]["name"] for n in nodes})

    def collect_orphans(self, nodes: set[str]) -> list[str]:
        """Force-delete the pods bound to a node not among `nodes` (those that exist); their names."""
        collected = []
        for pod in json.loads(self.api.list_pod_for_all_namespaces(_preload_content=False).data)["items"]:
            node, meta = pod.get("spec", {}).get("nodeName"), pod["metadata"]
            if not node or node in nodes:
                continue
            if meta.get("finalizers"):
                self.api.patch_namespaced_pod(
                    meta["name"],
                    meta["namespace"],
                    {"metadata": {"finalizers": None}},
                    _preload_content=False,
                )
            if not meta.get("deletionTimestamp") or not meta.get("finalizers"):
                with contextlib.suppress(ApiException):
                    self.api.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
            log.info("pod %s/%s: its node %s is gone: deleted", meta["namespace"], meta["name"], node)
            collected.append(meta["name"])
        return collected

    def mark_silent(self, nodes: list[dict[str, Any]]) -> list[str]:
        """Marks Unknown those of `nodes` silent past their grace; their names."""
        now = datetime.datetime.now(datetime.UTC)
        marked = []
        for node in nodes:
            silent = silent_for(node, now)
            if silent is not None and silent > self.grace_s:
                name = node["metadata"]["name"]
                condition = {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": f"Kubelet stopped posting node status ({silent:.0f}s)",
                }
                self.api.patch_node_status(name, {"status": {"conditions": [condition]}})
                log.info("node %s: no status for %.0fs: Ready Unknown", name, silent)
                marked.append(name)
        return marked

    def start(self) -> NodeLifecycle:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()
