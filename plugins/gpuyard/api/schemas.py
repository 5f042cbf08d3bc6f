"""Response bodies of the API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.model import Attempt, Event, Job
from gpuyard.domain.spec import JobSpec
from gpuyard.store.jobs import JobDetail


class JobOut(BaseModel):
    id: str
    team: str
    name: str
    state: str
    spec: JobSpec
    created_by: str
    created_at: datetime
    updated_at: datetime
    failures: int
    attempt_count: int
    cancel_requested: bool
    reason: str | None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.id,
            team=job.team,
            name=job.name,
            state=job.state.value,
            spec=job.spec,
            created_by=job.created_by,
            created_at=job.created_at,
            updated_at=job.updated_at,
            failures=job.failures,
            attempt_count=job.attempt_count,
            cancel_requested=job.cancel_requested,
            reason=job.reason,
        )


class AttemptOut(BaseModel):
    id: str
    number: int
    state: str
    fencing_token: int
    placement: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    exit_code: int | None
    reason: str | None
    step: int | None
    checkpoint_url: str | None
    checkpoint_step: int | None

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptOut:
        return cls(
            id=attempt.id,
            number=attempt.number,
            state=attempt.state.value,
            fencing_token=attempt.fencing_token,
            placement=attempt.placement,
            created_at=attempt.created_at,
            updated_at=attempt.updated_at,
            exit_code=attempt.exit_code,
            reason=attempt.reason,
            step=attempt.step,
            checkpoint_url=attempt.checkpoint_url,
            checkpoint_step=attempt.checkpoint_step,
        )


class EventOut(BaseModel):
    seq: int
    type: str
    attempt_id: str | None
    data: dict[str, Any]
    at: datetime | None

    @classmethod
    def of(cls, event: Event) -> EventOut:
        return cls(seq=event.seq, type=event.type, attempt_id=event.attempt_id, data=event.data, at=event.at)


class JobDetailOut(JobOut):
    attempts: list[AttemptOut]
    events: list[EventOut]

    @classmethod
    def of_detail(cls, detail: JobDetail) -> JobDetailOut:
        return cls(
            **JobOut.of(detail.job).model_dump(),
            attempts=[AttemptOut.of(a) for a in detail.attempts],
            events=[EventOut.of(e) for e in detail.events],
        )


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class TeamOut(BaseModel):
    name: str
    quota: TeamQuota


class TokenIn(BaseModel):
    team: str
    role: str = "member"
    description: str = ""


class TokenOut(BaseModel):
    id: str
    team: str
    role: str
    token: str
