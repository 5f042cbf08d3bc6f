"""Platform metrics from what the store recorded: the attempt and job records the API reads, turned
into the accounting's inputs (domain/accounting.py defines every figure), and the fair-share
attainment, which only the platform has. The API and Prometheus show the summary.

A summary may be scoped to some teams: then every figure counts only their attempts and jobs, and
the fair-share attainment (which compares a team with all the others) lists only those teams.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.domain.accounting import AttemptUse, JobUse, figures, split
from gpuyard.domain.feasibility import TeamQuota

FINISHED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class AttemptRecord:
    job_id: str
    team: str
    number: int
    state: str
    slices: tuple[tuple[str, int], ...]  # (node, GPUs leased on it)
    created_at: datetime  # reserved: its lease starts
    started_at: datetime | None  # its workers ran
    ended_at: datetime | None
    progress_lost_s: float  # at an interruption: time since its newest checkpoint (or its start)
    resumed: bool  # it was handed a checkpoint to resume from
    restore_s: float = 0.0  # its workers' reports: restoring that checkpoint
    checkpoint_stall_s: float = 0.0  # steps paused for checkpoint writes
    new_step_at: datetime | None = None  # first report of a step past the one it started from

    @property
    def gpus(self) -> int:
        return sum(gpus for _, gpus in self.slices)

    def price_per_hour(self, price_per_gpu_hour: Mapping[str, float]) -> float:
        return sum(gpus * price_per_gpu_hour.get(node, 0.0) for node, gpus in self.slices)

    def use(self, price_per_gpu_hour: Mapping[str, float], now: datetime) -> AttemptUse:
        """What the accounting reads of it; a live attempt is counted up to `now`."""
        end = self.ended_at or now
        return AttemptUse(
            job_id=self.job_id,
            team=self.team,
            outcome=self.state,
            gpus=self.gpus,
            busy_gpus=float(self.gpus),  # the platform leases what the spec asks, no more
            held_s=(end - self.created_at).total_seconds(),
            ran_s=(end - self.started_at).total_seconds() if self.started_at else 0.0,
            restore_s=self.restore_s,
            stall_s=self.checkpoint_stall_s,
            lost_s=self.progress_lost_s,
            resumed=self.resumed,
            made_step=self.new_step_at is not None,
            price_per_hour=self.price_per_hour(price_per_gpu_hour),
        )


@dataclass(frozen=True)
class JobRecord:
    id: str
    team: str
    state: str
    created_at: datetime
    first_attempt_at: datetime | None

    def use(self) -> JobUse:
        wait = (self.first_attempt_at - self.created_at).total_seconds() if self.first_attempt_at else None
        return JobUse(self.id, self.team, wait, self.state in FINISHED)


@dataclass(frozen=True)
class Summary:
    since: datetime  # start of the window summarized
    goodput: float | None  # useful GPU time / leased GPU time (docs/metrics.md)
    leased_gpu_hours: float
    useful_gpu_hours: float
    lost_gpu_hours: float
    queue_wait_p50_s: float | None
    queue_wait_p99_s: float | None
    resumes: int
    resume_success_share: float | None
    cost_total: float
    cost_per_finished_job: float | None
    fair_share_attainment: dict[str, float] = field(default_factory=dict)  # used share / entitled share


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
    uses = [a.use(price_per_gpu_hour, now) for a in attempts]
    used: dict[str, float] = {}  # GPU time held per team, every team: the attainment compares them
    for use in uses:
        used[use.team] = used.get(use.team, 0.0) + split(use).held_s * use.gpus
    shown = [u for u in uses if teams is None or u.team in teams]
    job_uses = [j.use() for j in jobs if teams is None or j.team in teams]
    got = figures(shown, job_uses)
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
        goodput=got.goodput,
        leased_gpu_hours=got.leased_gpu_s / 3600.0,
        useful_gpu_hours=got.useful_gpu_s / 3600.0,
        lost_gpu_hours=got.lost_gpu_s / 3600.0,
        queue_wait_p50_s=got.wait_p50_s,
        queue_wait_p99_s=got.wait_p99_s,
        resumes=got.resumes,
        resume_success_share=got.resume_success,
        cost_total=got.cost,
        cost_per_finished_job=got.cost_per_finished_job,
        fair_share_attainment=attainment,
    )
