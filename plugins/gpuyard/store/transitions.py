"""Applies state-machine transitions as guarded updates, each with its event in the same transaction.

Every state change of a job or an attempt goes through `move_job` or `move_attempt`: the edge is
checked against domain.states, the UPDATE only matches the expected state, and zero matched rows
mean another actor got there first (StaleState), never a silent overwrite.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from gpuyard.domain.states import (
    AttemptState,
    JobState,
    StaleState,
    check_attempt_transition,
    check_job_transition,
)
from gpuyard.store.outbox import append_event
from gpuyard.store.tables import attempts, jobs


def move_job(
    conn: Connection,
    job_id: str,
    expected: JobState,
    target: JobState,
    *,
    at: datetime,
    reason: str | None = None,
    attempt_id: str | None = None,
    changes: dict[str, Any] | None = None,
) -> None:
    check_job_transition(expected, target)
    result = conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == expected.value)
        .values(state=target.value, updated_at=at, reason=reason, **(changes or {}))
    )
    if result.rowcount != 1:
        actual = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
        raise StaleState("job", job_id, expected, actual)
    append_event(
        conn,
        type=f"job.{target.value.lower()}",
        job_id=job_id,
        attempt_id=attempt_id,
        at=at,
        data={"from": expected.value, "to": target.value, **({"reason": reason} if reason else {})},
    )


def move_attempt(
    conn: Connection,
    attempt_id: str,
    expected: AttemptState,
    target: AttemptState,
    *,
    at: datetime,
    reason: str | None = None,
    changes: dict[str, Any] | None = None,
) -> str:
    """Returns the attempt's job id."""
    check_attempt_transition(expected, target)
    result = conn.execute(
        update(attempts)
        .where(attempts.c.id == attempt_id, attempts.c.state == expected.value)
        .values(
            state=target.value, updated_at=at, **({"reason": reason} if reason else {}), **(changes or {})
        )
        .returning(attempts.c.job_id)
    )
    job_id = result.scalar()
    if job_id is None:
        actual = conn.execute(select(attempts.c.state).where(attempts.c.id == attempt_id)).scalar()
        raise StaleState("attempt", attempt_id, expected, actual)
    append_event(
        conn,
        type=f"attempt.{target.value.lower()}",
        job_id=job_id,
        attempt_id=attempt_id,
        at=at,
        data={"from": expected.value, "to": target.value, **({"reason": reason} if reason else {})},
    )
    return job_id
