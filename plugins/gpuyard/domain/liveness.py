"""Limits on a live attempt besides its lease: a hang (no progress) and the job's max_runtime.

The lease answers "are the workers still there?" (renewed by the workers' heartbeats and by the
launcher while it sees them alive). These answer "is what is there still worth running?": a job
whose reported step has not advanced within `liveness.progress_timeout` has hung, and a job that has
run for its `max_runtime` since its first start is out of time. Either is stopped by the scheduler
and counts as a failure (domain/retry.py): a hang is retried within the budget, max_runtime is not.
"""

from __future__ import annotations

from datetime import datetime

from gpuyard.domain.model import Attempt, Job
from gpuyard.domain.states import AttemptState, StopReason


def _since(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds()


def overdue(job: Job, attempt: Attempt, now: datetime) -> tuple[StopReason, str] | None:
    """Why this live attempt must be stopped now, or None while it may run on."""
    if attempt.stop_requested is not None:
        return None  # already asked to stop, for whatever reason came first
    limit = job.spec.max_runtime_s
    if limit is not None and job.first_started_at is not None and _since(now, job.first_started_at) > limit:
        return StopReason.MAX_RUNTIME, (
            f"ran {_since(now, job.first_started_at):.0f} s since its first start, "
            f"past max_runtime {job.spec.max_runtime}"
        )
    timeout = job.spec.liveness.progress_timeout_s
    if timeout is None or attempt.state != AttemptState.RUNNING:
        return None
    progressed = attempt.progress_at or attempt.started_at
    if progressed is not None and _since(now, progressed) > timeout:
        where = f"step {attempt.step}" if attempt.step is not None else "no step reported"
        return StopReason.HANG, (
            f"{where}, no progress for {_since(now, progressed):.0f} s "
            f"(liveness.progress_timeout {job.spec.liveness.progress_timeout})"
        )
    return None
