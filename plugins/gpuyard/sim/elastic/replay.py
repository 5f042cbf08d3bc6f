"""Replay a workload of elastic jobs on the study's cluster under a policy; per-job completion times.

As the study's `simulator.py`: every interval (60 s) the jobs train on what they hold, then the
policy sees the jobs submitted by then and not done, and each job whose allocation changed is
restarted on its new one. So a job waits for the next interval after its submission, and its GPUs
are freed at the first interval after it ends. The 16 nodes x 4 GPUs are one domain: where a job's
GPUs are matters only through the sync time measured for its placement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuyard.sim.elastic.jobs import ElasticJob, Submission
from gpuyard.sim.elastic.policies import POLICIES, Allocation, Policy
from gpuyard.sim.elastic.profiles import Application, Placement

NODES = 16
GPUS_PER_NODE = 4
INTERVAL_S = 60
RESTART_S = 30


def replay(
    submissions: Sequence[Submission],
    apps: Mapping[str, Application],
    policy: str | Policy = "tiresias",
    *,
    nodes: int = NODES,
    gpus_per_node: int = GPUS_PER_NODE,
    interval_s: int = INTERVAL_S,
    restart_s: int = RESTART_S,
    on_interval: Callable[[int, Sequence[ElasticJob]], None] | None = None,
) -> list[ElasticJob]:
    """The jobs of `submissions`, all completed (`completed_s`); `on_interval(now_s, active jobs)` is
    called after each scheduling decision."""
    if isinstance(policy, str) and policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    scheduler = POLICIES[policy]() if isinstance(policy, str) else policy
    node_gpus = [gpus_per_node] * nodes
    jobs = [ElasticJob.from_submission(s, apps) for s in submissions]
    too_big = [job.name for job in jobs if job.num_replicas > sum(node_gpus)]
    if too_big:
        raise ValueError(f"jobs {too_big} ask for more than the cluster's {sum(node_gpus)} GPUs")
    held: dict[str, Allocation] = {}
    now = 0
    running: list[ElasticJob] = []
    while any(job.completed_s is None for job in jobs):
        for job in running:
            job.advance(now, interval_s)
        now += interval_s
        active = [job for job in jobs if job.submitted_s <= now and job.completed_s is None]
        if not active:
            continue
        before = {job.name: held[job.name] for job in active if job.name in held}
        held = scheduler.allocate(now, active, node_gpus, before)
        for job in active:
            if held.get(job.name) != before.get(job.name):
                job.reallocate(placement_of(held.get(job.name, ())), restart_s)
        running = [job for job in active if job.placement]
        if on_interval is not None:
            on_interval(now, active)
    return jobs


def jcts(jobs: Sequence[ElasticJob]) -> dict[str, float]:
    """Completion minus submission, seconds, by job name."""
    return {job.name: job.completed_s - job.submitted_s for job in jobs if job.completed_s is not None}


def placement_of(allocation: Allocation) -> Placement:
    """GPUs per node, nodes in the order the allocation first names them."""
    counts: dict[int, int] = {}
    for node in allocation:
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts.values())
