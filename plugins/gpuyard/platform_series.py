"""The platform figures over time: the window cut into equal steps, each step's figures from the same
attempt and job records the summary reads (platform_metrics), by the same definitions
(domain/accounting.py). Pure; the API serves it, the page draws it.

Per step: GPU utilization (GPU-seconds leased in the step over the fleet's), goodput (useful over
leased), queue wait p50/p99 of the jobs whose first attempt was placed in the step, the share of
resumes that succeeded (counted in the step their attempt was placed), progress lost, the cost
leased, the cost per job finished in the step (all its attempts), and, for the whole platform only,
the idle cost (what the fleet's free GPUs cost in the step). Each attempt's time, as the accounting
splits it, is laid on its timeline and clipped to the steps: its launch first, then its restore, its
steps and stalls (spread evenly over each other), and the steps it lost last (since its newest
checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuyard.domain.accounting import cost as cost_of
from gpuyard.domain.accounting import percentile, ratio, resume_decided, resume_succeeded, split
from gpuyard.platform_metrics import AttemptRecord, JobRecord


@dataclass(frozen=True)
class Point:
    start: datetime
    end: datetime
    utilization: float | None  # leased GPU-seconds / the fleet's GPU-seconds
    goodput: float | None
    leased_gpu_hours: float
    lost_gpu_hours: float
    queue_wait_p50_s: float | None
    queue_wait_p99_s: float | None
    resume_success_share: float | None
    cost: float
    cost_per_job: float | None
    jobs_finished: int
    idle_cost: float | None  # None when scoped to some teams: idle GPUs belong to no team


def _overlaps(
    start: datetime, end: datetime, origin: datetime, step_s: float, n: int
) -> list[tuple[int, float]]:
    """(step index, seconds of [start, end) inside it) for every step the interval touches."""
    if end <= start:
        return []
    first = max(0, int((start - origin).total_seconds() // step_s))
    last = min(n - 1, int((end - origin).total_seconds() // step_s))
    out = []
    for i in range(first, last + 1):
        lo = max(start, origin + timedelta(seconds=i * step_s))
        hi = min(end, origin + timedelta(seconds=(i + 1) * step_s))
        if hi > lo:
            out.append((i, (hi - lo).total_seconds()))
    return out


def _step_of(
    at: datetime | None, origin: datetime, step_s: float, n: int, *, ending: bool = False
) -> int | None:
    """The step holding `at`: a step holds its start, or, for an end (`ending`), its own end."""
    if at is None:
        return None
    offset = (at - origin).total_seconds() / step_s
    i = math.ceil(offset) - 1 if ending else math.floor(offset)
    return i if 0 <= i < n else None


def series(
    attempts: list[AttemptRecord],
    jobs: list[JobRecord],
    price_per_gpu_hour: dict[str, float],
    fleet_gpus: int,
    fleet_cost_per_hour: float,
    start: datetime,
    end: datetime,
    steps: int,
    teams: Collection[str] | None = None,
) -> list[Point]:
    """`steps` equal steps from `start` to `end`; with `teams`, only their attempts and jobs count."""
    if steps < 1 or end <= start:
        raise ValueError(f"need at least one step over a non-empty window, got {steps} over {start}..{end}")
    if teams is not None:
        attempts = [a for a in attempts if a.team in teams]
        jobs = [j for j in jobs if j.team in teams]
    step_s = (end - start).total_seconds() / steps
    leased, useful, lost, cost = ([0.0] * steps for _ in range(4))
    waits: list[list[float]] = [[] for _ in range(steps)]
    resumed, resumed_ok = [0] * steps, [0] * steps
    job_cost: dict[str, float] = {}
    job_end: dict[str, datetime] = {}
    for a in attempts:
        use = a.use(price_per_gpu_hour, end)
        part = split(use)
        until = a.ended_at or end
        steps_from = until - timedelta(seconds=part.held_s - part.launch_s - part.restore_s)
        lost_from = until - timedelta(seconds=part.lost_s)
        worked = part.useful_s + part.stall_s
        for i, seconds in _overlaps(a.created_at, min(until, end), start, step_s, steps):
            leased[i] += seconds * use.gpus
            cost[i] += seconds * use.price_per_hour / 3600.0
        if worked > 0:
            for i, seconds in _overlaps(steps_from, min(lost_from, end), start, step_s, steps):
                useful[i] += seconds * part.useful_s / worked * use.busy_gpus
        for i, seconds in _overlaps(lost_from, min(until, end), start, step_s, steps):
            lost[i] += seconds * use.busy_gpus
        if resume_decided(use) and (k := _step_of(a.created_at, start, step_s, steps)) is not None:
            resumed[k] += 1
            resumed_ok[k] += resume_succeeded(use)
        job_cost[a.job_id] = job_cost.get(a.job_id, 0.0) + cost_of(use)
        if a.ended_at is not None and (a.job_id not in job_end or a.ended_at > job_end[a.job_id]):
            job_end[a.job_id] = a.ended_at
    finished: list[list[str]] = [[] for _ in range(steps)]
    for j in jobs:
        job = j.use()
        if (
            j.first_attempt_at is not None
            and job.wait_s is not None
            and (k := _step_of(j.first_attempt_at, start, step_s, steps)) is not None
        ):
            waits[k].append(job.wait_s)
        if job.finished and (k := _step_of(job_end.get(j.id), start, step_s, steps, ending=True)) is not None:
            finished[k].append(j.id)
    capacity_s = fleet_gpus * step_s
    points = []
    for i in range(steps):
        done = finished[i]
        points.append(
            Point(
                start=start + timedelta(seconds=i * step_s),
                end=start + timedelta(seconds=(i + 1) * step_s),
                utilization=leased[i] / capacity_s if capacity_s else None,
                goodput=ratio(useful[i], leased[i]),
                leased_gpu_hours=leased[i] / 3600.0,
                lost_gpu_hours=lost[i] / 3600.0,
                queue_wait_p50_s=percentile(waits[i], 50),
                queue_wait_p99_s=percentile(waits[i], 99),
                resume_success_share=ratio(resumed_ok[i], resumed[i]),
                cost=cost[i],
                cost_per_job=sum(job_cost.get(j, 0.0) for j in done) / len(done) if done else None,
                jobs_finished=len(done),
                idle_cost=(
                    max(0.0, fleet_cost_per_hour * step_s / 3600.0 - cost[i]) if teams is None else None
                ),
            )
        )
    return points
