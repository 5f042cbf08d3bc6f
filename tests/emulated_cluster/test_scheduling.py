"""The emulated cluster's placement rule (local_cluster.scheduling): kube-scheduler's filters on plain
objects, and its message when no node fits."""

from __future__ import annotations

from typing import Any

from local_cluster.scheduling import Decision, place, requests


def node(name: str, *, gpus: int = 2, cpu: str = "4", memory: str = "8Gi", **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"gpu": "h100", **extra.get("labels", {})}},
        "spec": {"unschedulable": extra.get("unschedulable", False), "taints": extra.get("taints", [])},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "10"},
            "conditions": [{"type": "Ready", "status": extra.get("ready", "True")}],
        },
    }


def pod(
    name: str = "p",
    *,
    gpus: int = 1,
    cpu: str | None = None,
    memory: str | None = None,
    on: str | None = None,
    phase: str = "Running",
    **spec: Any,
) -> dict[str, Any]:
    requested = {k: v for k, v in {"cpu": cpu, "memory": memory}.items() if v}
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, **({"requests": requested} if requested else {})}
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "resources": resources}],
            **({"nodeName": on} if on else {}),
            **spec,
        },
        "status": {"phase": phase},
    }


def pinned(node_name: str) -> dict[str, Any]:
    """gpuyard's pods: required node affinity on the node's name."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def test_a_limit_stands_for_a_missing_request_and_a_pod_counts_once() -> None:
    asked = requests(pod(gpus=2, cpu="1500m", memory="1Gi"))
    assert asked == {"nvidia.com/gpu": 2, "cpu": 1.5, "memory": 1024**3, "pods": 1}


def test_the_first_node_by_name_that_fits_and_the_one_its_affinity_names() -> None:
    nodes = [node("b"), node("a")]
    assert place(pod(), nodes, []) == Decision("a")
    assert place(pod(affinity=pinned("b")), nodes, []) == Decision("b")
    assert place(pod(nodeSelector={"gpu": "a100"}), nodes, []).node is None


def test_bound_pods_take_their_requests_until_they_end() -> None:
    nodes = [node("a", gpus=2)]
    running = [pod("x", gpus=2, on="a")]
    decision = place(pod(), nodes, running)
    assert decision == Decision(None, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    assert place(pod(), nodes, [pod("x", gpus=2, on="a", phase="Succeeded")]) == Decision("a")
    assert place(pod(), nodes, [pod("x", gpus=2)]) == Decision("a")  # pending elsewhere: not on a


def test_cpu_and_memory_are_placed_with_the_gpus() -> None:
    nodes = [node("a", cpu="4", memory="8Gi"), node("b", cpu="16", memory="64Gi")]
    assert place(pod(cpu="8", memory="16Gi"), nodes, []) == Decision("b")
    decision = place(pod(cpu="32"), nodes, [])
    assert decision.reason == "0/2 nodes are available: 2 Insufficient cpu."


def test_taints_readiness_and_cordons_and_the_message_that_counts_each_reason() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        node("a", taints=[taint]),
        node("b", ready="False"),
        node("c", unschedulable=True),
        node("d", labels={"gpu": "a100"}),
    ]
    decision = place(pod(nodeSelector={"gpu": "h100"}), nodes, [])
    assert decision == Decision(
        None,
        "0/4 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}, 1 node(s) were not ready, "
        "1 node(s) were unschedulable.",
    )
    tolerated = pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert place(tolerated, nodes[:1], []) == Decision("a")
    assert place(pod(tolerations=[{"key": "other", "operator": "Exists"}]), nodes[:1], []).node is None
    assert place(pod(tolerations=[{"operator": "Exists"}]), nodes[:1], []) == Decision("a")  # tolerates all
    soft = node("e", taints=[{"key": "k", "effect": "PreferNoSchedule"}])
    assert place(pod(), [soft], []) == Decision("e")


def test_affinity_terms_are_ored_and_their_requirements_anded() -> None:
    nodes = [node("a", labels={"zone": "1"}), node("b", labels={"zone": "2", "spot": "true"})]
    terms = [
        {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["2"]},
                {"key": "spot", "operator": "DoesNotExist"},
            ]
        },
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["2"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    assert place(pod(affinity=affinity), nodes[1:], []).node is None  # zone 2 but spot: neither term
    assert place(pod(affinity=affinity), nodes, []) == Decision("a")
