"""Read models of what the store holds: Job, Attempt, Lease, Event. Immutable snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuyard.domain.spec import JobSpec
from gpuyard.domain.states import AttemptState, JobState


@dataclass(frozen=True)
class Job:
    id: str
    team: str
    name: str
    spec: JobSpec
    state: JobState
    created_at: datetime
    updated_at: datetime
    created_by: str
    failures: int = 0
    attempt_count: int = 0
    cancel_requested: bool = False
    reason: str | None = None
    not_before: datetime | None = None
    attained_gpu_s: float = 0.0
    progress_lost_gpu_s: float = 0.0
    checkpoint_url: str | None = None
    checkpoint_step: int | None = None
    checkpoint_site: str | None = None
    checkpoint_cost_s: float | None = None
    checkpoint_bytes: int | None = None
    first_started_at: datetime | None = None


@dataclass(frozen=True)
class Lease:
    """A claim on one GPU of one node for an attempt; valid until `expires_at` and only for its token."""

    attempt_id: str
    node: str
    gpu_index: int
    fencing_token: int
    expires_at: datetime


@dataclass(frozen=True)
class Attempt:
    id: str
    job_id: str
    number: int
    state: AttemptState
    fencing_token: int
    placement: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    exit_code: int | None = None
    reason: str | None = None
    step: int | None = None
    checkpoint_url: str | None = None
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = None
    stop_requested: str | None = None
    borrowed: bool = False
    started_at: datetime | None = None
    ended_at: datetime | None = None
    heartbeat_at: datetime | None = None
    progress_lost_s: float | None = None
    lease_expires_at: datetime | None = None
    progress_at: datetime | None = None
    resume_step: int | None = None  # the checkpoint step it resumes from
    restore_s: float | None = None  # its workers' reports (docs/metrics.md)
    checkpoint_stall_s: float | None = None
    new_step_at: datetime | None = None  # first step past `resume_step` reported
    # Its workers' newest measure (the heartbeat's `throughput`): seconds per optimizer step, each
    # worker's micro-batch, micro-batches accumulated per step, the global batch.
    step_s: float | None = None
    local_batch: int | None = None
    accum_steps: int | None = None
    global_batch: int | None = None
    # The worker's proof of this attempt (domain/attempt_secret.py); None once it has ended. Out of
    # repr, so no log line of an attempt shows it.
    attempt_secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Event:
    """Something that happened, kept as the job's history AND published by the outbox relay."""

    seq: int
    type: str
    job_id: str
    attempt_id: str | None
    data: dict[str, Any] = field(default_factory=dict)
    at: datetime | None = None
