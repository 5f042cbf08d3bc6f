"""What a job does after an attempt ends: succeed, fail, or wait for the next attempt.

Preemption and node loss are not the job's fault: they resume from the newest checkpoint and never
use up the failure budget. A failure of the job's own code counts, and the job fails once the
budget is spent (or at once, for an exit code its policy does not retry).

Losses are not the job's fault either, but they are not free: each one costs a restore and whatever
ran since the last checkpoint, and a flapping node could bounce a job for ever. The first loss in an
hour resumes at once; each further one waits `lost_backoff`, doubling (up to `MAX_LOST_BACKOFF_S`),
and no job is lost more than `lost_per_hour` times in any hour: after that many it waits for the
oldest of them to be an hour old.

Only the platform can make an ending not the job's fault (`attribute`): a worker that exits 75
("preempted") when nobody asked it to stop, or 76 ("refused") while its attempt was live and its
token current, has failed, and is retried with backoff within its budget like any other failure. A
worker the platform's own SIGTERM or SIGKILL ended after it asked for a preemption was preempted.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from gpuyard.domain.spec import RetryPolicy
from gpuyard.domain.states import AttemptState, JobState, StopReason
from gpuyard.domain.units import parse_duration
from training.exit_codes import PREEMPTED, STALE_FENCING_TOKEN

LOSS_WINDOW_S = 3600.0  # the hour `lost_per_hour` counts in
MAX_LOST_BACKOFF_S = 600.0
PLATFORM_SIGNALS = (-signal.SIGTERM, -signal.SIGKILL)  # exit statuses: the launcher's signals ended it


@dataclass(frozen=True)
class AfterAttempt:
    job_state: JobState
    failures: int  # the job's failure count after this attempt
    backoff_s: float  # wait before the next attempt
    reason: str


def attribute(
    outcome: AttemptState,
    exit_code: int | None,
    reason: str | None,
    *,
    stop: StopReason | None,
    disrupted: bool,
) -> tuple[AttemptState, str | None]:
    """The outcome the store records for what a launcher observed.

    `stop`: why the platform asked the attempt to stop, if it did; `disrupted`: the launcher saw the
    platform itself stop or lose the workers (its own signal, an eviction, a node gone)."""
    asked = stop is not None or disrupted
    if stop in (StopReason.HANG, StopReason.MAX_RUNTIME) and outcome != AttemptState.SUCCEEDED:
        why = "no progress within liveness.progress_timeout" if stop == StopReason.HANG else "max_runtime"
        return AttemptState.FAILED, f"stopped: {why} ({reason})"
    if stop == StopReason.PREEMPT and outcome == AttemptState.FAILED and exit_code in PLATFORM_SIGNALS:
        # The platform's own signal ended it (SIGTERM, or SIGKILL after the grace period) once it had
        # asked for a preemption: a worker that does not catch SIGTERM (a plain command) was preempted,
        # not failed, and spends none of its budget.
        return AttemptState.PREEMPTED, f"{reason}: stopped by the platform's preemption"
    if outcome == AttemptState.PREEMPTED and not asked:
        return AttemptState.FAILED, f"{reason}, but nobody asked it to stop (exit {PREEMPTED} is a failure)"
    if outcome == AttemptState.LOST and exit_code == STALE_FENCING_TOKEN:
        return (
            AttemptState.FAILED,
            f"{reason}, but its attempt was live and current (exit {STALE_FENCING_TOKEN} is a failure)",
        )
    return outcome, reason


def after_attempt(
    policy: RetryPolicy,
    outcome: AttemptState,
    failures: int,
    exit_code: int | None,
    reason: str | None,
    *,
    cancel_requested: bool,
    stop: StopReason | None = None,
    earlier_losses_s: Sequence[float] = (),
) -> AfterAttempt:
    """`earlier_losses_s`: for a LOST attempt, how long ago each earlier loss of the job within the
    past hour was."""
    if cancel_requested:
        return AfterAttempt(JobState.CANCELLED, failures, 0.0, "cancelled")
    if outcome == AttemptState.SUCCEEDED:
        return AfterAttempt(JobState.SUCCEEDED, failures, 0.0, "attempt succeeded")
    if outcome == AttemptState.PREEMPTED:
        return AfterAttempt(JobState.PENDING, failures, 0.0, f"preempted: {reason}; resumes")
    if outcome == AttemptState.LOST:
        wait_s, why = after_loss(policy, earlier_losses_s)
        return AfterAttempt(JobState.PENDING, failures, wait_s, f"lost: {reason}; {why}")
    if outcome == AttemptState.CANCELLED:
        return AfterAttempt(JobState.CANCELLED, failures, 0.0, reason or "cancelled")
    count = failures + 1
    if stop == StopReason.MAX_RUNTIME:
        return AfterAttempt(JobState.FAILED, count, 0.0, f"{reason}; max_runtime is not retried")
    retryable = policy.retryable_exit_codes is None or exit_code in policy.retryable_exit_codes
    if not retryable:
        return AfterAttempt(JobState.FAILED, count, 0.0, f"{reason}; exit code {exit_code} is not retried")
    if count > policy.max_failures:
        return AfterAttempt(
            JobState.FAILED, count, 0.0, f"{reason}; failure {count} of {policy.max_failures} allowed"
        )
    return AfterAttempt(JobState.PENDING, count, parse_duration(policy.backoff), f"{reason}; retry {count}")


def after_loss(policy: RetryPolicy, earlier_losses_s: Sequence[float]) -> tuple[float, str]:
    """How long a job waits after a loss, and why, given the ages of its earlier losses within the
    hour: the backoff, or longer when a loss right at resumption would make one too many in an hour
    (the `lost_per_hour`-th newest loss, this one first, must be an hour old first)."""
    ages = sorted([0.0, *(a for a in earlier_losses_s if 0 <= a < LOSS_WINDOW_S)])
    count, cap = len(ages), policy.lost_per_hour
    capped_s = LOSS_WINDOW_S - ages[cap - 1] if count >= cap else 0.0
    backoff_s = (
        min(MAX_LOST_BACKOFF_S, parse_duration(policy.lost_backoff) * 2 ** (count - 2)) if count > 1 else 0.0
    )
    if capped_s > backoff_s:
        times = "once" if count == 1 else f"{count} times"
        return (
            capped_s,
            f"lost {times} within an hour (retry.lost_per_hour {cap}): resumes in {capped_s:.0f}s",
        )
    if backoff_s == 0:
        return 0.0, "resumes"
    return backoff_s, f"lost {count} times within an hour: resumes in {backoff_s:.0f}s"


def young_daly_interval_s(
    checkpoint_cost_s: float, mtbi_s: float, *, floor_s: float = 30.0, ceiling_s: float = 6 * 3600.0
) -> float:
    """The checkpoint interval that minimises expected lost work: sqrt(2 x cost x MTBI)."""
    if checkpoint_cost_s <= 0 or mtbi_s <= 0:
        raise ValueError(f"cost and MTBI must be positive, got {checkpoint_cost_s} and {mtbi_s}")
    return min(ceiling_s, max(floor_s, math.sqrt(2.0 * checkpoint_cost_s * mtbi_s)))
