"""Platform metrics from what the store recorded: goodput, queue wait, resumes, cost, lost progress,
fair-share attainment. Pure functions over attempt and job records; the API and Prometheus show them.

A summary may be scoped to some teams: then every figure counts only their attempts and jobs, and
the fair-share attainment (which compares a team with all the others) lists only those teams.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.domain.feasibility import TeamQuota


@dataclass(frozen=True)
class AttemptRecord:
    job_id: str
    team: str
    number: int
    state: str
    gpus: int
    nodes: tuple[str, ...]
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    progress_lost_s: float
    resumed_from_checkpoint: bool  # it started with a checkpoint to resume from


@dataclass(frozen=True)
class JobRecord:
    id: str
    team: str
    state: str
    created_at: datetime
    first_attempt_at: datetime | None


@dataclass(frozen=True)
class Summary:
    since: datetime  # start of the window summarized
    goodput: float | None  # GPU-seconds of progress kept / GPU-seconds leased
    leased_gpu_hours: float
    lost_gpu_hours: float
    queue_wait_p50_s: float | None
    queue_wait_p99_s: float | None
    resumes: int
    resume_success_share: float | None
    cost_total: float
    cost_per_finished_job: float | None
    fair_share_attainment: dict[str, float] = field(default_factory=dict)  # used share / entitled share


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarize(
    attempts: list[AttemptRecord],
    jobs: list[JobRecord],
    quotas: dict[str, TeamQuota],
    price_per_gpu_hour: dict[str, float],
    now: datetime,
    since: datetime,
    teams: Collection[str] | None = None,
) -> Summary:
    """The window's figures; with `teams`, those of these teams only."""
    leased = kept = lost = cost = 0.0
    used: dict[str, float] = {}
    cost_by_job: dict[str, float] = {}
    for a in attempts:
        end = a.ended_at or now
        held_s = max(0.0, (end - a.created_at).total_seconds()) * a.gpus
        used[a.team] = used.get(a.team, 0.0) + held_s
        if teams is not None and a.team not in teams:
            continue
        ran_s = max(0.0, (end - a.started_at).total_seconds()) * a.gpus if a.started_at else 0.0
        lost_here = a.progress_lost_s * a.gpus
        leased += held_s
        lost += lost_here
        kept += max(0.0, ran_s - lost_here)
        hourly = sum(price_per_gpu_hour.get(node, 0.0) for node in a.nodes) / max(1, len(a.nodes))
        job_cost = held_s / 3600.0 * hourly
        cost += job_cost
        cost_by_job[a.job_id] = cost_by_job.get(a.job_id, 0.0) + job_cost
    if teams is not None:
        jobs = [j for j in jobs if j.team in teams]
        attempts = [a for a in attempts if a.team in teams]
    waits = [(j.first_attempt_at - j.created_at).total_seconds() for j in jobs if j.first_attempt_at]
    resumed = [a for a in attempts if a.number > 1 and a.resumed_from_checkpoint]
    finished = [j.id for j in jobs if j.state in ("SUCCEEDED", "FAILED", "CANCELLED")]
    # A weight the store holds from before weights were bounded counts as no entitlement at all.
    entitled = {t: q.gpu_quota * q.weight for t, q in quotas.items() if math.isfinite(q.weight)}
    entitled_total = sum(entitled.values()) or 1.0
    used_total = sum(used.values()) or 1.0
    attainment = {
        team: (used.get(team, 0.0) / used_total) / (share / entitled_total)
        for team, share in entitled.items()
        if share > 0 and used.get(team) and (teams is None or team in teams)
    }
    return Summary(
        since=since,
        goodput=kept / leased if leased else None,
        leased_gpu_hours=leased / 3600.0,
        lost_gpu_hours=lost / 3600.0,
        queue_wait_p50_s=percentile(waits, 50),
        queue_wait_p99_s=percentile(waits, 99),
        resumes=len(resumed),
        resume_success_share=(
            sum(1 for a in resumed if a.started_at is not None) / len(resumed) if resumed else None
        ),
        cost_total=cost,
        cost_per_finished_job=(
            sum(cost_by_job.get(j, 0.0) for j in finished) / len(finished) if finished else None
        ),
        fair_share_attainment=attainment,
    )
