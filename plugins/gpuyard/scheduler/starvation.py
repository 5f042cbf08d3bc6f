"""The starvation guard: how long a job may wait before it is served first, and which running jobs
it holds (`StarvationGuard`). A policy may carry one (`policy.Policy.starvation`); the order reads
which jobs starve, and the `starvation` preemption rule lets them in (`preemption.RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuyard.scheduler.snapshot import ClusterState, PendingJob


def dominant_share(team: str, state: ClusterState, without: int = 0) -> float:
    """GPUs the team holds (less `without`) over its weighted nominal quota: lower is served first."""
    quota = state.quota(team)
    return (state.usage.get(team, 0) - without) / (max(quota.gpu_quota, 1) * quota.weight)


@dataclass(frozen=True)
class Standing:
    """What a job's bound depends on: when it was submitted, its size, the GPU time it has held, its
    team's `dominant_share` and the fleet's `demand` (`StarvationGuard`)."""

    submitted_s: float
    gpus: int
    attained_gpu_s: float
    share: float
    demand: float = 1.0


@dataclass(frozen=True)
class StarvationGuard:
    """Bounds how long any job waits, relative to its size and to its team's quota.

    A job's bound is `factor x (its run + floor_s) x max(1, share) [x max(1, demand)]`: its run is the
    time it has held GPUs so far (attained GPU-seconds over its GPUs: its size, as far as a
    non-clairvoyant scheduler knows it), `share` its team's GPUs in use over its weighted nominal
    quota (`dominant_share`), and, with `overload`, `demand` the GPUs asked by the queued and running
    jobs over the fleet's (`demand`). A job is starving once the time since it was submitted
    exceeds its bound. Starving jobs are ordered first in their priority class, oldest first, and a
    starving job may take GPUs from any settled attempt of no higher class that is not held, or held
    and submitted later (with `takes_younger_only`, only from jobs submitted later) (`preemption.RULES`,
    "starvation"); no rule lets a job that is not starving take a held attempt.
    A running job is held while its wait exceeds `keep` x its bound (`held`): a job let in at its
    bound is not given back to least attained service the moment its bound passes its wait again
    (with keep 1 it was, after moments, and came back `factor x MIN_RUN_S` later, each round paying
    its own and its victims' checkpoints: the whole Philly trace thrashed). So, while its team stays
    within its quota and the attempts around it are preemptible and of its class, the oldest
    starving job gets in at once, and a job finishes within about `factor x (duration + floor_s)` of
    its submission (plus the MIN_RUN_S a victim must have run and its stop checkpoint, and waits
    behind older starving jobs, or with `takes_younger_only` behind older jobs), in proportion longer as
    its team is over its quota (and with `overload` as the fleet's demand exceeds its GPUs). As a job runs,
    `keep` x its bound grows `keep x factor x stretch` times faster than its wait: it is held for
    `held_for_s`, then an ordinary job again. Tiresias promotes a job after it waited a multiple of
    its last run; Kueue and Slurm age priorities.
    """

    factor: float
    floor_s: float
    # Hysteresis: a running job stays held (taken only by older starving jobs) while its wait exceeds
    # `keep` x its bound, so a job let in at its bound runs on until its bound is 1 / keep times its wait.
    keep: float = 1.0
    # Stretch every bound by the fleet's overload (`demand`, when above 1): GPUs asked by the
    # queued and the running jobs over the fleet's GPUs. Under overload some jobs wait whatever the
    # order; a bound that ignores it has the guard reorder what tiresias' order already serves well.
    overload: bool = False
    # A starving job takes GPUs only from jobs submitted after it (first come, first served among
    # jobs past their bound and those they displace): it never evicts an older job, which would
    # itself be closer to its own bound, and two starving gangs do not take each other's GPUs in turn.
    takes_younger_only: bool = False

    def __post_init__(self) -> None:
        if self.factor <= 1:
            raise ValueError(
                f"StarvationGuard factor must be above 1 (a job would starve as it runs), got {self.factor}"
            )
        if self.floor_s <= 0:
            raise ValueError(f"StarvationGuard floor_s must be positive, got {self.floor_s}")
        if not 1 / self.factor < self.keep <= 1:
            raise ValueError(
                f"StarvationGuard keep must be in (1 / factor, 1] (a running job would be held for ever), "
                f"got {self.keep}"
            )

    def demand(self, queued_gpus: float, used_gpus: float, capacity: int) -> float:
        """The fleet's demand that stretches the bounds (with `overload`; else 1): GPUs asked by the
        queued jobs and held by the running ones over the fleet's GPUs. Above 1 the fleet is
        overloaded and some jobs wait whatever the order."""
        return (queued_gpus + used_gpus) / max(capacity, 1) if self.overload else 1.0

    def stretch(self, share: float, demand: float) -> float:
        """How many times `factor` the bound is: the team's share over its quota, and (with
        `overload`) the fleet's demand over its GPUs, each when above 1."""
        return max(1.0, share) * (max(1.0, demand) if self.overload else 1.0)

    def bound_s(self, job: Standing) -> float:
        return (
            self.factor
            * (job.attained_gpu_s / max(job.gpus, 1) + self.floor_s)
            * self.stretch(job.share, job.demand)
        )

    def overdue_s(self, job: Standing, now_s: float) -> float:
        """How long past its bound the job is at `now_s` (negative: how long until it)."""
        return now_s - job.submitted_s - self.bound_s(job)

    def starving(self, job: Standing, now_s: float) -> bool:
        return self.overdue_s(job, now_s) > 0

    def held(self, job: Standing, now_s: float) -> bool:
        """Does the guard hold a running job (its wait past `keep` x its bound)? Only an older starving
        job may take it, and no job that is not starving."""
        return now_s - job.submitted_s > self.keep * self.bound_s(job)

    def held_for_s(self, job: Standing, now_s: float) -> float:
        """For a running job: how long it stays held, at a constant share and demand (0: it is not). Its wait
        grows by 1 per second run, `keep` x its bound by `keep x factor x stretch`, above 1. A running
        job that is not held never becomes so."""
        left = now_s - job.submitted_s - self.keep * self.bound_s(job)
        return max(left, 0.0) / (self.keep * self.factor * self.stretch(job.share, job.demand) - 1)

    def starving_jobs(
        self, jobs: list[PendingJob], state: ClusterState, now: datetime, demand: float = 1.0
    ) -> frozenset[str]:
        now_s = now.timestamp()
        shares = {team: dominant_share(team, state) for team in {j.team for j in jobs}}
        return frozenset(
            j.id
            for j in jobs
            if self.starving(Standing(j.age[0], j.gpus, j.attained_gpu_s, shares[j.team], demand), now_s)
        )
