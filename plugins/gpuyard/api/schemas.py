"""Request and response bodies of the API (besides the JobSpec itself).

What a response carries is scoped to what its caller may know: an attempt's fencing token (with its
id, the worker's credential for heartbeats) and a secret's value are never in one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpuyard.domain.admission import AdmissionPolicy
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.model import Attempt, Event, Job
from gpuyard.domain.spec import JobSpec, Name, Text
from gpuyard.store.jobs import JobDetail
from gpuyard.store.teams import Role, TokenInfo


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
    placement: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    exit_code: int | None
    reason: str | None
    step: int | None
    checkpoint_url: str | None
    checkpoint_step: int | None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    progress_lost_s: float | None = Field(None, description="Work since the last checkpoint, lost at its end")

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptOut:
        return cls(
            id=attempt.id,
            number=attempt.number,
            state=attempt.state.value,
            placement=attempt.placement,
            created_at=attempt.created_at,
            updated_at=attempt.updated_at,
            exit_code=attempt.exit_code,
            reason=attempt.reason,
            step=attempt.step,
            checkpoint_url=attempt.checkpoint_url,
            checkpoint_step=attempt.checkpoint_step,
            started_at=attempt.started_at,
            ended_at=attempt.ended_at,
            progress_lost_s=attempt.progress_lost_s,
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
    policy: AdmissionPolicy


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: Name
    role: Role = Role.MEMBER
    description: Text = Field("", max_length=200)
    expires_at: AwareDatetime | None = Field(
        None, description="When the token stops working; default and maximum are the platform's."
    )


class TokenOut(BaseModel):
    """A new token: the only time its secret is shown."""

    id: str
    team: str
    role: str
    expires_at: datetime
    token: str


class TokenInfoOut(BaseModel):
    id: str
    team: str
    role: str
    description: str
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, info: TokenInfo) -> TokenInfoOut:
        return cls(
            id=info.id,
            team=info.team,
            role=info.role.value,
            description=info.description,
            created_at=info.created_at,
            expires_at=info.expires_at,
            last_used_at=info.last_used_at,
            revoked_at=info.revoked_at,
        )


class SecretIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: Text = Field(min_length=1, max_length=65_536)


class SecretOut(BaseModel):
    """A secret as listed: its name only; values are written, never read, through the API."""

    team: str
    name: str
