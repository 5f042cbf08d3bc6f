"""Scheduling policies of the elastic replay, by name in `POLICIES` (a later policy is an addition).

A policy is asked, every scheduling interval, which GPUs each active job holds: an allocation is the
node of each GPU, in the order they were given. A job whose allocation changes is restarted on the
new one (or preempted, given none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Protocol

from gpuyard.sim.elastic.jobs import ElasticJob
from gpuyard.sim.elastic.sizing import GpuyardSizing

Allocation = tuple[int, ...]  # the node of each GPU a job holds
TIRESIAS_THRESHOLD_GPU_S = 16 * 3600  # the study's one queue threshold: 16 GPU-hours


class Policy(Protocol):
    def allocate(
        self, now_s: int, jobs: Sequence[ElasticJob], node_gpus: Sequence[int], held: Mapping[str, Allocation]
    ) -> dict[str, Allocation]:
        """Allocations of `jobs` (the active ones, in submission order) on nodes of `node_gpus` GPUs,
        knowing those `held` since the last call."""
        ...


class Tiresias:
    """The study's Tiresias (`tiresias.py`): two queues and one threshold, each job at its tuned size.

    A job enters the first queue and is demoted to the back of the second once the GPU-time it ran
    (seconds scheduled times its GPUs) reaches the threshold; it is never promoted back. Each interval
    the queues are walked in order, first then second, and a job runs if its GPUs still fit in what
    the jobs before it left (so a smaller job further back may pass a larger one). A running job keeps
    its GPUs; a job that no longer fits is preempted; a job started is given the nodes with the most
    free GPUs first (lowest index on a tie), as few nodes as that makes.
    """

    def __init__(self, threshold_gpu_s: int = TIRESIAS_THRESHOLD_GPU_S) -> None:
        self.threshold_gpu_s = threshold_gpu_s
        self.queues: tuple[list[str], list[str]] = ([], [])
        self.running: set[str] = set()
        self.ran_s: dict[str, int] = {}  # seconds scheduled, restarts included
        self.checked_s: dict[str, int] = {}

    def allocate(
        self, now_s: int, jobs: Sequence[ElasticJob], node_gpus: Sequence[int], held: Mapping[str, Allocation]
    ) -> dict[str, Allocation]:
        by_name = {job.name: job for job in jobs}
        first, second = ([name for name in queue if name in by_name] for queue in self.queues)
        self.queues = (first, second)
        for job in jobs:
            if job.name not in self.ran_s:
                self.ran_s[job.name] = 0
                first.append(job.name)
            elif job.name in self.running:
                self.ran_s[job.name] += now_s - self.checked_s[job.name]
                if job.name in first and self.ran_s[job.name] * job.num_replicas >= self.threshold_gpu_s:
                    first.remove(job.name)
                    second.append(job.name)
            self.checked_s[job.name] = now_s
        free = sum(node_gpus)
        self.running = set()
        for name in (*first, *second):
            if by_name[name].num_replicas <= free:
                self.running.add(name)
                free -= by_name[name].num_replicas
        allocations = {name: held[name] for name in self.running if held.get(name)}
        node_free = list(node_gpus)
        for allocation in allocations.values():
            for node in allocation:
                node_free[node] -= 1
        for name in (*first, *second):
            if name in self.running and name not in allocations:
                allocations[name] = _fewest_nodes(node_free, by_name[name].num_replicas)
        return allocations


def _fewest_nodes(node_free: list[int], gpus: int) -> Allocation:
    """Take `gpus` GPUs from the nodes with the most free first; `node_free` is updated."""
    allocation: list[int] = []
    while len(allocation) < gpus:
        node = max(range(len(node_free)), key=node_free.__getitem__)
        take = min(node_free[node], gpus - len(allocation))
        allocation.extend([node] * take)
        node_free[node] -= take
    return tuple(allocation)


# gpuyard: each job sized every interval by its fitted goodput (sizing.py), its batch adaptive or fixed.
POLICIES: dict[str, Callable[[], Policy]] = {
    "tiresias": Tiresias,
    "gpuyard": GpuyardSizing,
    "gpuyard-fixed-batch": partial(GpuyardSizing, adaptive_batch=False),
}
