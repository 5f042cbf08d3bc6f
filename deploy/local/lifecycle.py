"""The node lifecycle controller's part in the emulated cluster: a node whose agent has not reported
within `grace_s` (its Ready condition's lastHeartbeatTime) is marked Ready `Unknown`, reason
`NodeStatusUnknown`, as Kubernetes' node controller does after its node-monitor grace period. Its
pods are left as they are: what became of them is unknown, and only their node's return or its
removal tells."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

from kubernetes import client as k8s
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
        self._loop = Periodic("node-lifecycle", every_s, self.mark_silent)

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
