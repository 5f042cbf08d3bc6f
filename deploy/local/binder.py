"""kube-scheduler's part in the emulated cluster: every pending pod bound to the node `scheduling.place`
chooses, or left Pending with the reason no node fits.

Level-triggered: each pass lists the nodes and pods and decides afresh, so a pod left Pending is bound
as soon as room appears (a pod ends, a node comes back). kmock has no Binding subresource, so a bind
is a patch of `spec.nodeName`; an unschedulable pod gets kube-scheduler's condition (`PodScheduled`
False, reason `Unschedulable`, its message), written only when the message changes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client as k8s
from local_cluster.periodic import Periodic
from local_cluster.scheduling import place

log = logging.getLogger(__name__)


def _pending(pod: dict[str, Any]) -> bool:
    return not pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp")


class Binder:
    def __init__(self, api: k8s.CoreV1Api, every_s: float = 0.25):
        """`every_s`: a pass lists every node and pod; as often as the node agents' (`PASS_EVERY_S`)."""
        self.api = api
        self._told: dict[str, str] = {}  # pod uid -> the Unschedulable message last written
        self._loop = Periodic("binder", every_s, self.bind_pending)

    def bind_pending(self) -> int:
        """One pass; how many pods it bound."""
        node_items = _items(self.api.list_node(_preload_content=False))
        pod_items = _items(self.api.list_pod_for_all_namespaces(_preload_content=False))
        bound = 0
        for pod in sorted(pod_items, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            if not _pending(pod):
                continue
            meta = pod["metadata"]
            decision = place(pod, node_items, pod_items)
            if decision.node is None:
                if self._told.get(meta["uid"]) != decision.reason:
                    self._unschedulable(meta["name"], meta["namespace"], decision.reason)
                    self._told[meta["uid"]] = decision.reason
                continue
            self.api.patch_namespaced_pod(
                meta["name"], meta["namespace"], {"spec": {"nodeName": decision.node}}, _preload_content=False
            )
            pod["spec"]["nodeName"] = decision.node  # its requests count for the pods after it
            self._told.pop(meta["uid"], None)
            log.info("bound %s/%s to %s", meta["namespace"], meta["name"], decision.node)
            bound += 1
        return bound

    def _unschedulable(self, name: str, namespace: str, reason: str) -> None:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": reason}
        self.api.patch_namespaced_pod_status(
            name,
            namespace,
            {"status": {"phase": "Pending", "conditions": [condition]}},
            _preload_content=False,
        )
        log.info("%s/%s stays Pending: %s", namespace, name, reason)

    def start(self) -> Binder:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data)["items"])
