"""What a job does after an attempt ends: succeed, fail, or wait for the next attempt.

Preemption and node loss are not the job's fault: they resume from the newest checkpoint and never
use up the failure budget. A failure of the job's own code counts, and the job fails once the
budget is spent (or at once, for an exit code its policy does not retry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuyard.domain.spec import RetryPolicy
from gpuyard.domain.states import AttemptState, JobState
from gpuyard.domain.units import parse_duration


@dataclass(frozen=True)
class AfterAttempt:
    job_state: JobState
    failures: int  # the job's failure count after this attempt
    backoff_s: float  # wait before the next attempt
    reason: str


def after_attempt(
    policy: RetryPolicy,
    outcome: AttemptState,
    failures: int,
    exit_code: int | None,
    reason: str | None,
    *,
    cancel_requested: bool,
) -> AfterAttempt:
    if cancel_requested:
        return AfterAttempt(JobState.CANCELLED, failures, 0.0, "cancelled")
    if outcome == AttemptState.SUCCEEDED:
        return AfterAttempt(JobState.SUCCEEDED, failures, 0.0, "attempt succeeded")
    if outcome in (AttemptState.PREEMPTED, AttemptState.LOST):
        return AfterAttempt(JobState.PENDING, failures, 0.0, f"{outcome.value.lower()}: {reason}; resumes")
    if outcome == AttemptState.CANCELLED:
        return AfterAttempt(JobState.CANCELLED, failures, 0.0, reason or "cancelled")
    count = failures + 1
    retryable = policy.retryable_exit_codes is None or exit_code in policy.retryable_exit_codes
    if not retryable:
        return AfterAttempt(JobState.FAILED, count, 0.0, f"{reason}; exit code {exit_code} is not retried")
    if count > policy.max_failures:
        return AfterAttempt(
            JobState.FAILED, count, 0.0, f"{reason}; failure {count} of {policy.max_failures} allowed"
        )
    return AfterAttempt(JobState.PENDING, count, parse_duration(policy.backoff), f"{reason}; retry {count}")


def young_daly_interval_s(
    checkpoint_cost_s: float, mtbi_s: float, *, floor_s: float = 30.0, ceiling_s: float = 6 * 3600.0
) -> float:
    """The checkpoint interval that minimises expected lost work: sqrt(2 x cost x MTBI)."""
    if checkpoint_cost_s <= 0 or mtbi_s <= 0:
        raise ValueError(f"cost and MTBI must be positive, got {checkpoint_cost_s} and {mtbi_s}")
    return min(ceiling_s, max(floor_s, math.sqrt(2.0 * checkpoint_cost_s * mtbi_s)))
