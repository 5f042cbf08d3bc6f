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
    def __init__(self, api: k8s.CoreV1Api, grace_s: float = 40.0, every_s: float = 0.2):
        self.api, self.grace_s = api, grace_s
        self._loop = Periodic("node-lifecycle", every_s, self.pass_once)

    def pass_once(self) -> None:
        self.mark_silent()
        self.collect_orphans()

    def collect_orphans(self) -> list[str]:
        """Force-delete the pods bound to a node that no longer exists; their names."""
        nodes = {
            n["metadata"]["name"]
            for n in json.loads(self.api.list_node(_preload_content=False).data)["items"]
        }
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

    def mark_silent(self) -> list[str]:
        """One pass; the nodes it marked Unknown."""
        now = datetime.datetime.now(datetime.UTC)
        marked = []
        for node in json.loads(self.api.list_node(_preload_content=False).data)["items"]:
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
