"""Where a pod may run, as kube-scheduler's filters decide it: pure functions of the pod, the nodes and
the pods already bound.

A node fits a pod when it is Ready and not cordoned, the pod tolerates its NoSchedule and NoExecute
taints, it matches the pod's `nodeSelector` and required node affinity, and its allocatable CPU,
memory, extended resources (`nvidia.com/gpu`) and pod count hold the pod's requests beside those of
the pods bound to it that have not ended. Of the nodes that fit, the first by name is chosen (the
emulated cluster scores nothing: gpuyard's pods name their node). A pod no node fits gets
kube-scheduler's message: `0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) didn't
match Pod's node affinity/selector.`
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.utils.quantity import parse_quantity

Obj = Mapping[str, Any]
ENDED = ("Succeeded", "Failed")
AFFINITY = "node(s) didn't match Pod's node affinity/selector"


@dataclass(frozen=True)
class Decision:
    """The node chosen, or None and why none fits."""

    node: str | None
    reason: str = ""


def requests(pod: Obj) -> Counter[str]:
    """What the pod asks of a node: its containers' requests (a limit stands for a missing request,
    as the API server defaults it), and one pod."""
    total: Counter[str] = Counter()
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, quantity in asked.items():
            total[name] += parse_quantity(quantity)
    total["pods"] += 1
    return total


def _ready(node: Obj) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _matches(requirement: Obj, values: Mapping[str, str]) -> bool:
    key, operator, wanted = requirement["key"], requirement["operator"], requirement.get("values") or []
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present:
        number, bound = int(values[key]), int(wanted[0])
        return number > bound if operator == "Gt" else number < bound
    return False


def _affinity(pod: Obj, node: Obj) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    required = (
        (pod.get("spec", {}).get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(  # terms are ORed, the requirements of a term ANDed
        all(_matches(r, labels) for r in term.get("matchExpressions") or [])
        and all(_matches(r, fields) for r in term.get("matchFields") or [])
        for term in required.get("nodeSelectorTerms") or []
    )


def _misfit(pod: Obj, node: Obj, bound: Sequence[Obj]) -> list[str]:
    """Why `node` cannot take `pod` (kube-scheduler's words), none when it can."""
    spec = node.get("spec") or {}
    if not _ready(node):
        return ["node(s) were not ready"]
    if spec.get("unschedulable"):
        return ["node(s) were unschedulable"]
    tolerations = pod.get("spec", {}).get("tolerations") or []
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    if not _affinity(pod, node):
        return [AFFINITY]
    allocatable = node.get("status", {}).get("allocatable") or {}
    used: Counter[str] = Counter()
    for other in bound:
        used.update(requests(other))
    return [
        f"Insufficient {name}" if name != "pods" else "Too many pods"
        for name, asked in sorted(requests(pod).items())
        if asked and used[name] + asked > parse_quantity(allocatable.get(name, 0))
    ]


def place(pod: Obj, nodes: Sequence[Obj], pods: Sequence[Obj]) -> Decision:
    """The node for `pod` among `nodes`, given every pod of the cluster (`pods`: those bound to a node
    and not ended take their requests from it)."""
    on: dict[str, list[Obj]] = {}
    for other in pods:
        node = other.get("spec", {}).get("nodeName")
        if node and other.get("status", {}).get("phase") not in ENDED:
            on.setdefault(node, []).append(other)
    reasons: Counter[str] = Counter()
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        misfit = _misfit(pod, node, on.get(node["metadata"]["name"], []))
        if not misfit:
            return Decision(node["metadata"]["name"])
        reasons.update(misfit)
    counts = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items(), key=lambda r: r[0]))
    return Decision(None, f"0/{len(nodes)} nodes are available: {counts}.")
