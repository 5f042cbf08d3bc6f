"""Scheduling policies: how the queue is ordered and which mechanisms a cycle may use.

Every policy runs through the same cycle (cycle.py) and plugins; only the order and the switches
differ. None of them reads a job's true duration: scheduling is non-clairvoyant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

from gpuyard.scheduler.snapshot import ClusterState, PendingJob

Order = Callable[[list[PendingJob], ClusterState, datetime], list[PendingJob]]


def dominant_share(team: str, state: ClusterState) -> float:
    """GPUs the team holds over its weighted nominal quota: lower is served first."""
    quota = state.quota(team)
    return state.usage.get(team, 0) / (max(quota.gpu_quota, 1) * quota.weight)


def headroom(jobs: list[PendingJob], state: ClusterState) -> dict[str, int]:
    """GPUs each team of `jobs` may still take within its nominal quota: a job asking more borrows
    from the cohort. Per team, once per order, as queues run to thousands."""
    return {team: state.quota(team).gpu_quota - state.usage.get(team, 0) for team in {j.team for j in jobs}}


def kueue_order(jobs: list[PendingJob], state: ClusterState, now: datetime) -> list[PendingJob]:
    """Kueue's: workloads that fit their team's nominal quota before those that must borrow, then
    priority, then age. Without it, a borrower requeued by a reclaim is re-admitted ahead of the
    reclaiming workload on the GPUs it just gave back, and the two evict each other forever."""
    room = headroom(jobs, state)
    return sorted(jobs, key=lambda j: (j.gpus > room[j.team], -j.priority, j.age))


_AGE = attrgetter("age")  # oldest first; in C, as queues run to thousands


def fifo_order(jobs: list[PendingJob], state: ClusterState, now: datetime) -> list[PendingJob]:
    return sorted(jobs, key=_AGE)


def las_order(jobs: list[PendingJob], state: ClusterState, now: datetime) -> list[PendingJob]:
    return sorted(jobs, key=lambda j: (j.las, j.age))


def gpuyard_order(jobs: list[PendingJob], state: ClusterState, now: datetime) -> list[PendingJob]:
    """Priority class, then least attained service (2D-LAS), then within-quota before borrowing (as
    Kueue, so a reclaim is not undone by its own victim), then weighted fair share, then age.

    Attained service comes before quota: a team's nominal quota guarantees its work a place ahead of
    borrowing work that has had as much service, not ahead of less-served work (see `_may_evict`).
    """
    room = headroom(jobs, state)
    shares = {team: dominant_share(team, state) for team in room}
    return sorted(
        jobs,
        key=lambda j: (
            -j.priority,
            j.las,
            j.gpus > room[j.team],  # borrows
            shares[j.team],
            j.age,
        ),
    )


@dataclass(frozen=True)
class Policy:
    name: str
    order: Order
    backfill: bool  # later jobs may start when an earlier one does not fit
    reserve_head: bool  # the first job that does not fit holds a domain so it is not starved
    quota: bool  # admit within team quota, borrowing idle cohort quota (Kueue semantics)
    preempt_priority: bool  # a higher class may preempt lower-class preemptible attempts
    preempt_las: bool  # a less-served job may preempt a more-served one (2D-LAS)
    reclaim: bool  # a team under its nominal quota reclaims what others borrowed


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy(
            "fifo",
            fifo_order,
            backfill=False,
            reserve_head=False,
            quota=False,
            preempt_priority=False,
            preempt_las=False,
            reclaim=False,
        ),
        Policy(
            "fifo-backfill",
            fifo_order,
            backfill=True,
            reserve_head=True,
            quota=False,
            preempt_priority=False,
            preempt_las=False,
            reclaim=False,
        ),
        Policy(
            "kueue",
            kueue_order,
            backfill=True,
            reserve_head=False,
            quota=True,
            preempt_priority=True,
            preempt_las=False,
            reclaim=True,
        ),
        Policy(
            "tiresias",
            las_order,
            backfill=True,
            reserve_head=False,
            quota=False,
            preempt_priority=False,
            preempt_las=True,
            reclaim=False,
        ),
        Policy(
            "gpuyard",
            gpuyard_order,
            backfill=True,
            reserve_head=True,
            quota=True,
            preempt_priority=True,
            preempt_las=True,
            reclaim=True,
        ),
    )
}
