"""The transactional outbox: events appended in the caller's transaction, claimed and marked by the relay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, event, func, insert, select, update

from gpuyard.domain.model import Event
from gpuyard.store.tables import events

_INSERT_EVENT = insert(events)
_APPENDED = "gpuyard.outbox.appended"  # in a connection's `info`: its transaction appended events


def on_events_committed(engine: Engine, callback: Callable[[], None]) -> None:
    """Call `callback` after each transaction on `engine` that appended events commits (the relay of
    the same process polls at once, not at its next idle poll)."""

    def committed(conn: Connection) -> None:
        if conn.info.pop(_APPENDED, False):
            callback()

    event.listen(engine, "commit", committed)
    event.listen(engine, "rollback", lambda conn: conn.info.pop(_APPENDED, None))


def append_event(
    conn: Connection,
    *,
    type: str,
    job_id: str,
    at: datetime,
    attempt_id: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Record an event; it becomes visible (and publishable) only if the caller's transaction commits."""
    conn.info[_APPENDED] = True
    conn.execute(
        _INSERT_EVENT,
        {"type": type, "job_id": job_id, "attempt_id": attempt_id, "data": data or {}, "at": at},
    )


def append_events(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """`append_event` for many events at once (multi-row inserts): each row has its keyword arguments."""
    if rows:
        conn.info[_APPENDED] = True
        conn.execute(
            _INSERT_EVENT,
            [{"attempt_id": None, "data": {}, **row} for row in rows],
        )


def claim_unpublished(conn: Connection, limit: int) -> list[Event]:
    """Lock a batch of unpublished events. Other relays skip locked rows (PostgreSQL), or wait (SQLite)."""
    rows = conn.execute(
        select(events)
        .where(events.c.published_at.is_(None))
        .order_by(events.c.seq)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [_event(row) for row in rows]


def count_unpublished(conn: Connection) -> int:
    """Events not yet published (the relay's backlog; a partial index keeps it cheap on PostgreSQL)."""
    return int(conn.execute(select(func.count()).where(events.c.published_at.is_(None))).scalar() or 0)


def mark_published(conn: Connection, seqs: Sequence[int], at: datetime) -> None:
    conn.execute(update(events).where(events.c.seq.in_(seqs)).values(published_at=at))


def job_events(conn: Connection, job_id: str) -> list[Event]:
    rows = conn.execute(select(events).where(events.c.job_id == job_id).order_by(events.c.seq))
    return [_event(row) for row in rows]


def _event(row: Any) -> Event:
    return Event(
        seq=row.seq, type=row.type, job_id=row.job_id, attempt_id=row.attempt_id, data=row.data, at=row.at
    )
