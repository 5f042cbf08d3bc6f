"""Reading the event log by cursor: `seq` orders every change, and a reader trusts it up to the head.

Writers take a `seq` when they insert and commit later, so on PostgreSQL seq 41 can become visible
after seq 42: a reader that moved its cursor to 42 would never see 41. The head is therefore the
newest seq below which nothing is missing. A hole older than `grace_s` is given up: its
transaction rolled back (sequences never reuse a number) or took longer than any outbox write
should. SQLite has a single writer, so holes never form there; the rule is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, func, select

from gpuyard.domain.model import Event
from gpuyard.store.outbox import _event
from gpuyard.store.tables import events, jobs


@dataclass(frozen=True)
class Mark:
    """A row's place in the log and who may see it: what a waiting reader is woken by."""

    seq: int
    job_id: str
    team: str | None


@dataclass
class Head:
    """The trusted head of the log and the holes above it, each with when it was first seen."""

    seq: int
    holes: dict[int, float] = field(default_factory=dict)

    def advance(self, seqs: Sequence[int], now: float, grace_s: float) -> int:
        """Move over the contiguous run of `seqs` (ascending, all above the head); returns the head."""
        expected = self.seq + 1
        for seq in seqs:
            if seq < expected:
                continue
            if seq > expected:
                first_seen = self.holes.setdefault(expected, now)
                if now - first_seen < grace_s:
                    break
            self.seq, expected = seq, seq + 1
        self.holes = {start: seen for start, seen in self.holes.items() if start > self.seq}
        return self.seq


def start_head(conn: Connection, settled_before: datetime) -> int:
    """Where a reader that has seen nothing starts walking: the newest row written before
    `settled_before` (older transactions have long committed), else just below the oldest row."""
    # Never MAX(seq) of everything: a lower seq may still be in flight.
    settled = conn.execute(select(func.max(events.c.seq)).where(events.c.at < settled_before)).scalar()
    if settled is not None:
        return int(settled)
    oldest = conn.execute(select(func.min(events.c.seq))).scalar()
    return 0 if oldest is None else int(oldest) - 1


def marks_after(conn: Connection, after: int, limit: int) -> list[Mark]:
    """The rows above `after`, oldest first, with their job's team."""
    rows = conn.execute(
        select(events.c.seq, events.c.job_id, jobs.c.team)
        .select_from(events.outerjoin(jobs, jobs.c.id == events.c.job_id))
        .where(events.c.seq > after)
        .order_by(events.c.seq)
        .limit(limit)
    )
    return [Mark(seq=r.seq, job_id=r.job_id, team=r.team) for r in rows]


def read(
    conn: Connection,
    *,
    after: int,
    upto: int,
    job_id: str | None,
    teams: Sequence[str] | None,
    limit: int,
) -> list[Event]:
    """Events in (after, upto], oldest first; `teams=None` reads every team's."""
    query = (
        select(events)
        .select_from(events.join(jobs, jobs.c.id == events.c.job_id))
        .where(events.c.seq > after, events.c.seq <= upto)
        .order_by(events.c.seq)
        .limit(limit)
    )
    if job_id is not None:
        query = query.where(events.c.job_id == job_id)
    if teams is not None:
        query = query.where(jobs.c.team.in_(teams))
    return [_event(row) for row in conn.execute(query)]
