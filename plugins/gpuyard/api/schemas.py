"""Request and response bodies of the API (besides the JobSpec itself).

What a response carries is scoped to what its caller may know: an attempt's fencing token (with its
id, the worker's credential for heartbeats) and a secret's value are never in one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpuyard.domain.admission import AdmissionPolicy
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import JobSpec, Name, Text
from gpuyard.store.jobs import JobDetail
from gpuyard.store.teams import Role


class _Mirror(BaseModel):
    """A response that shows a record: the fields it declares, read by name from the record (an enum
    as its value), and nothing else the record holds (an attempt's fencing token stays out)."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, record: object) -> Self:
        return cls.model_validate(record)


class JobOut(_Mirror):
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


class AttemptOut(_Mirror):
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
    step_s: float | None = Field(None, description="Seconds of one optimizer step, as its workers measured")
    local_batch: int | None = Field(None, description="Each worker's micro-batch, as they last reported")
    accum_steps: int | None = Field(None, description="Micro-batches each worker accumulates per step")
    global_batch: int | None = Field(None, description="Examples per optimizer step over all its workers")


class EventOut(_Mirror):
    seq: int
    type: str
    attempt_id: str | None
    data: dict[str, Any]
    at: datetime | None


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


class TokenInfoOut(_Mirror):
    id: str
    team: str
    role: str
    description: str
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class SecretIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: Text = Field(min_length=1, max_length=65_536)


class SecretOut(BaseModel):
    """A secret as listed: its name only; values are written, never read, through the API."""

    team: str
    name: str
