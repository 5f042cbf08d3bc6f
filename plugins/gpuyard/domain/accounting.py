"""The platform's figures, each defined once: leased, useful and lost GPU time, goodput, resume success,
queue wait percentiles and cost. The running platform (platform_metrics, platform_series, Prometheus)
and the simulator (sim/metrics.py) turn what they recorded into `AttemptUse` and `JobUse` values and
read every figure from here, so the two cannot drift apart; docs/metrics.md defines them in words.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpuyard.domain.states import TERMINAL_ATTEMPT_STATES, AttemptState

ENDED = frozenset(state.value for state in TERMINAL_ATTEMPT_STATES)
INTERRUPTED = frozenset({AttemptState.PREEMPTED.value, AttemptState.LOST.value})


@dataclass(frozen=True)
class AttemptUse:
    """One attempt as the accounting reads it. Seconds run from its lease's start to its end (to now
    while it lives); `ran_s` and the parts of it are the workers' time."""

    job_id: str
    team: str
    outcome: str  # its AttemptState: an ending, or a live state while it runs
    gpus: int  # GPUs leased
    busy_gpus: float  # GPUs its steps use: `gpus`, fewer where a gang was rounded up or a GPU is shared
    held_s: float  # its lease, from reservation to its end
    ran_s: float  # of `held_s`, its workers ran (0: they never started)
    restore_s: float  # of `ran_s`, restoring the checkpoint it resumed from
    stall_s: float  # of `ran_s`, steps paused while checkpoints were written
    lost_s: float  # of `ran_s`, at an interruption: steps made after its newest complete checkpoint
    resumed: bool  # it was handed a checkpoint to resume from
    made_step: bool  # it made a step past the one it started from
    price_per_hour: float  # of all its GPUs together


@dataclass(frozen=True)
class JobUse:
    id: str
    team: str
    wait_s: float | None  # submission to its first attempt's reservation; None: never placed
    finished: bool  # it ended: SUCCEEDED, FAILED or CANCELLED


@dataclass(frozen=True)
class Split:
    """One attempt's time, seconds per leased GPU: `held_s` = launch + restore + stall + lost + useful,
    where launch is the lease's time before its workers ran."""

    held_s: float
    launch_s: float
    restore_s: float
    stall_s: float
    lost_s: float
    useful_s: float


def split(a: AttemptUse) -> Split:
    """Where an attempt's lease went. Steps are the workers' time less the restore and the stalls;
    of them, none is kept by a FAILED attempt (it failed on its own: its work is not delivered even
    where a retry resumes from its checkpoint), and an interrupted one keeps those up to its newest
    complete checkpoint."""
    ran = min(max(0.0, a.ran_s), max(0.0, a.held_s))
    restore = min(max(0.0, a.restore_s), ran)
    stall = min(max(0.0, a.stall_s), ran - restore)
    steps = ran - restore - stall
    if a.outcome == AttemptState.FAILED.value:
        lost = steps
    elif a.outcome in INTERRUPTED:
        lost = min(max(0.0, a.lost_s), steps)
    else:
        lost = 0.0
    return Split(max(0.0, a.held_s), max(0.0, a.held_s) - ran, restore, stall, lost, steps - lost)


def cost(a: AttemptUse) -> float:
    """Its lease's price: every GPU leased, for as long as it was held, at its node's price."""
    return a.price_per_hour * max(0.0, a.held_s) / 3600.0


def resume_decided(a: AttemptUse) -> bool:
    """A resume counts once it made a step or ended; a cancel before its first step is the caller's
    doing, not a failed resume, and is not counted."""
    if not a.resumed:
        return False
    if a.made_step or a.outcome == AttemptState.SUCCEEDED.value:
        return True
    return a.outcome in ENDED and a.outcome != AttemptState.CANCELLED.value


def resume_succeeded(a: AttemptUse) -> bool:
    """It finished its restore and made a new step (or succeeded: nothing was left after the restore)."""
    return resume_decided(a) and (a.made_step or a.outcome == AttemptState.SUCCEEDED.value)


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q% of the values at or below it (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = math.ceil(round(q * len(ordered) / 100.0, 9))  # rounded: 99.9% of 1000 is rank 999
    return ordered[min(len(ordered), max(1, rank)) - 1]


def ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True)
class Figures:
    leased_gpu_s: float
    useful_gpu_s: float
    lost_gpu_s: float
    goodput: float | None  # useful / leased
    resumes: int  # resumes decided (`resume_decided`)
    resumes_ok: int
    resume_success: float | None  # resumes_ok / resumes
    wait_p50_s: float | None
    wait_p99_s: float | None
    cost: float
    jobs_finished: int
    cost_per_finished_job: float | None  # every attempt of the finished jobs, over how many they are


def figures(attempts: Iterable[AttemptUse], jobs: Iterable[JobUse]) -> Figures:
    """The figures of these attempts and jobs (the caller chooses them: a window, some teams)."""
    leased = useful = lost = total = 0.0
    resumes = resumes_ok = 0
    cost_by_job: dict[str, float] = {}
    for a in attempts:
        part = split(a)
        leased += part.held_s * a.gpus
        useful += part.useful_s * a.busy_gpus
        lost += part.lost_s * a.busy_gpus
        price = cost(a)
        total += price
        cost_by_job[a.job_id] = cost_by_job.get(a.job_id, 0.0) + price
        resumes += resume_decided(a)
        resumes_ok += resume_succeeded(a)
    job_list = list(jobs)
    waits = [j.wait_s for j in job_list if j.wait_s is not None]
    finished = [j.id for j in job_list if j.finished]
    return Figures(
        leased_gpu_s=leased,
        useful_gpu_s=useful,
        lost_gpu_s=lost,
        goodput=ratio(useful, leased),
        resumes=resumes,
        resumes_ok=resumes_ok,
        resume_success=ratio(resumes_ok, resumes),
        wait_p50_s=percentile(waits, 50),
        wait_p99_s=percentile(waits, 99),
        cost=total,
        jobs_finished=len(finished),
        cost_per_finished_job=ratio(sum(cost_by_job.get(j, 0.0) for j in finished), len(finished)),
    )
