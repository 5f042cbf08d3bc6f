"""Why each pending job waits, as the leading scheduler recorded it (domain/waiting.py).

The scheduler writes what changed since its last pass, confirming its lead in the same transaction
(a replica that lost it writes nothing); the API reads the table with the queue. A row outlives its
job's stay in the queue only until the next pass deletes it, and a new leader first deletes every row
of a job no longer PENDING (it may have missed the deletes of the one before).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from sqlalchemy import Connection, Engine, delete, insert, select

from gpuyard.domain.states import JobState
from gpuyard.domain.waiting import Reason, RecordedReason
from gpuyard.store import leadership
from gpuyard.store.leadership import Lead
from gpuyard.store.tables import jobs, waits

CHUNK = 500  # job ids per IN (...) list


def record(
    engine: Engine,
    changed: Mapping[str, RecordedReason],
    gone: Collection[str],
    *,
    lead: Lead | None,
    now: datetime,
) -> None:
    """Replace the rows of `changed` and delete those of `gone`, in one transaction under `lead`."""
    if not changed and not gone:
        return
    with leadership.fenced(engine, lead, now=now) as conn:
        stale = [*gone, *changed]
        for first in range(0, len(stale), CHUNK):
            conn.execute(delete(waits).where(waits.c.job_id.in_(stale[first : first + CHUNK])))
        if changed:
            conn.execute(
                insert(waits),
                [
                    {
                        "job_id": job_id,
                        "code": r.reason.code,
                        "text": r.reason.text,
                        "since": r.since,
                        "job_updated_at": r.job_updated_at,
                    }
                    for job_id, r in changed.items()
                ],
            )


def forget_left(engine: Engine) -> None:
    """Delete the rows of jobs no longer in the queue."""
    pending = select(jobs.c.id).where(jobs.c.state == JobState.PENDING.value)
    with engine.begin() as conn:
        conn.execute(delete(waits).where(waits.c.job_id.not_in(pending)))


def read(conn: Connection) -> dict[str, RecordedReason]:
    return {
        row.job_id: RecordedReason(Reason(row.code, row.text), row.since, row.job_updated_at)
        for row in conn.execute(select(waits))
    }
