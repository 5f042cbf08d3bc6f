"""Filter and score plugins: small pure functions, registered by name (`FILTERS`, `SCORES`).

A policy names the plugins it uses, scores with a weight (`policy.Policy`), as a kube-scheduler
profile does: a new plugin is one registry entry, and a policy takes it up by its name.

Filters judge one node for one job. They read only the node, the job's shape and its team's allowed
GPU types, never what is free now, so a fleet's answers hold across cycles (`snapshot.FleetIndex`
keeps them). Whether a node has room now (`room_now`: GPUs, CPU, memory) is the cycle's own test,
not a plugin. Scores
judge one candidate placement (a set of nodes inside one fast domain) from 0 (worst) to 100 (best);
the cycle adds them up by the policy's weights.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuyard.domain.fleet import Node, holds_host_resources
from gpuyard.domain.sites import held_share
from gpuyard.scheduler.snapshot import ClusterState, PendingJob

SPOT_TAINT = "gpuyard.io/spot"

Filter = Callable[[PendingJob, Node, ClusterState], bool]
Score = Callable[[PendingJob, list[Node], ClusterState], float]


def gpu_type(job: PendingJob, node: Node, state: ClusterState) -> bool:
    allowed = state.quota(job.team).allowed_gpu_types
    return (not job.gpu_types or node.gpu_type in job.gpu_types) and (not allowed or node.gpu_type in allowed)


def gpu_memory(job: PendingJob, node: Node, state: ClusterState) -> bool:
    return node.gpu_memory_gb >= job.gpu_memory_gb


def host_resources(job: PendingJob, node: Node, state: ClusterState) -> bool:
    """The node can hold one node's share of the job's CPU and memory at all (where it says how much
    it has): a pod that could never fit would wait Pending on it for ever."""
    return holds_host_resources(node, job.cpu, job.memory_gb)


def room_now(job: PendingJob, node: Node, state: ClusterState) -> bool:
    """Room on the node now, for one node's share of the job: free GPUs, and CPU and memory beside
    what its attempts use. The cycle's test as it picks nodes, not a registered filter."""
    return len(state.free[node.name]) >= job.gpus_per_node and state.host_room(node, job.cpu, job.memory_gb)


def taints(job: PendingJob, node: Node, state: ClusterState) -> bool:
    """A tainted node takes only jobs that tolerate every taint; spot capacity only preemptible jobs."""
    return all(t in job.tolerations or (t == SPOT_TAINT and job.preemptible) for t in node.taints)


def site(job: PendingJob, node: Node, state: ClusterState) -> bool:
    return not job.sites or node.site in job.sites


def data_access(job: PendingJob, node: Node, state: ClusterState) -> bool:
    """The node must reach every dataset the job names (a node with no prefixes reaches all)."""
    prefixes = node.data_prefixes
    return not prefixes or all(any(uri.startswith(p) for p in prefixes) for uri in job.data_uris)


FILTERS: dict[str, Filter] = {
    "gpu_type": gpu_type,
    "gpu_memory": gpu_memory,
    "host_resources": host_resources,
    "taints": taints,
    "site": site,
    "data_access": data_access,
}


def pack(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
    """Best fit: prefer the domain left with the fewest free GPUs, so whole domains stay free for gangs."""
    first = nodes[0]
    free_after = state.domain_free()[first.domain_key] - job.gpus
    capacity = sum(n.gpus for n in state.fleet_domain(first)) or 1
    return 100.0 * (1 - free_after / capacity)


def checkpoint_locality(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
    """Resume where the checkpoint is: moving it to another site costs a copy before the start."""
    return 100.0 if job.checkpoint_site is None or nodes[0].site == job.checkpoint_site else 0.0


def data_locality(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
    """Start where the data is: a start elsewhere stages what the site lacks first. The share of
    its data (by bytes) found at the site."""
    return 100.0 if not job.data else 100.0 * held_share(nodes[0].site, job.data)


def price(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
    highest = state.highest_price or 1.0
    return 100.0 * (1 - max(n.price_per_gpu_hour for n in nodes) / highest)


def spot_fit(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
    """Preemptible jobs belong on spot nodes; jobs that may not be preempted stay off them."""
    spot = sum(1 for n in nodes if n.preemptible) / len(nodes)
    return 100.0 * (spot if job.preemptible else 1 - spot)


SCORES: dict[str, Score] = {
    "pack": pack,
    "checkpoint_locality": checkpoint_locality,
    "data_locality": data_locality,
    "price": price,
    "spot_fit": spot_fit,
}
