"""Applies state-machine transitions as guarded updates, each with its event in the same transaction.

Every state change of a job or an attempt goes through `move_job` (`move_jobs` for many jobs at once)
or `move_attempt`: the edge is checked against domain.states, the UPDATE only matches the expected
state, and zero matched rows mean another actor got there first (StaleState), never a silent
overwrite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from gpuyard.domain.states import (
    TERMINAL_ATTEMPT_STATES,
    AttemptState,
    JobState,
    StaleState,
    check_attempt_transition,
    check_job_transition,
)
from gpuyard.store.outbox import append_event, append_events
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
        data=_edge_data(expected, target, reason),
    )


@dataclass(frozen=True)
class JobMove:
    """One job's part of `move_jobs`: what `move_job` takes besides the edge and the time."""

    job_id: str
    reason: str | None = None
    attempt_id: str | None = None
    changes: Mapping[str, Any] = field(default_factory=dict)


def move_jobs(
    conn: Connection, moves: Sequence[JobMove], expected: JobState, target: JobState, *, at: datetime
) -> None:
    """`move_job` for many jobs along one edge, set-based: one guarded UPDATE run for every job (an
    executemany) and one multi-row insert of their events. Every move changes the same columns. If
    any job was not in `expected`, StaleState names one, and the caller's transaction must roll back.
    """
    check_job_transition(expected, target)
    if not moves:
        return
    columns = sorted(moves[0].changes)
    for move in moves:
        if sorted(move.changes) != columns:
            raise ValueError(f"move_jobs: job {move.job_id} changes {sorted(move.changes)}, not {columns}")
    values: dict[str, Any] = {"state": target.value, "updated_at": at, "reason": bindparam("_reason")}
    values |= {column: bindparam(f"_{column}") for column in columns}
    result = conn.execute(
        update(jobs).where(jobs.c.id == bindparam("_id"), jobs.c.state == expected.value).values(values),
        [{"_id": m.job_id, "_reason": m.reason, **{f"_{c}": m.changes[c] for c in columns}} for m in moves],
    )
    if result.rowcount != len(moves):
        ids = [m.job_id for m in moves]
        states = dict(conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids))).all())
        stale = next(m.job_id for m in moves if states.get(m.job_id) != target.value)
        raise StaleState("job", stale, expected, states.get(stale))
    append_events(
        conn,
        [
            {
                "type": f"job.{target.value.lower()}",
                "job_id": m.job_id,
                "attempt_id": m.attempt_id,
                "at": at,
                "data": _edge_data(expected, target, m.reason),
            }
            for m in moves
        ],
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
    """Returns the attempt's job id. An ending clears the attempt's secret: it dies with the attempt."""
    check_attempt_transition(expected, target)
    ended = target in TERMINAL_ATTEMPT_STATES
    result = conn.execute(
        update(attempts)
        .where(attempts.c.id == attempt_id, attempts.c.state == expected.value)
        .values(
            state=target.value,
            updated_at=at,
            **({"reason": reason} if reason else {}),
            **({"attempt_secret": None} if ended else {}),
            **(changes or {}),
        )
        .returning(attempts.c.job_id, attempts.c.step, attempts.c.checkpoint_step)
    )
    row = result.one_or_none()
    if row is None:
        actual = conn.execute(select(attempts.c.state).where(attempts.c.id == attempt_id)).scalar()
        raise StaleState("attempt", attempt_id, expected, actual)
    # An ending says how far the attempt got and what it saved, so a follower can tell the progress
    # lost without reading the attempt back.
    progress = {"step": row.step, "checkpoint_step": row.checkpoint_step} if ended else {}
    append_event(
        conn,
        type=f"attempt.{target.value.lower()}",
        job_id=row.job_id,
        attempt_id=attempt_id,
        at=at,
        data=_edge_data(expected, target, reason) | progress,
    )
    return str(row.job_id)


def _edge_data(
    expected: JobState | AttemptState, target: JobState | AttemptState, reason: str | None
) -> dict[str, Any]:
    """A transition's event data: the state left, the state entered, and the reason when there is one."""
    return {"from": expected.value, "to": target.value, **({"reason": reason} if reason else {})}
