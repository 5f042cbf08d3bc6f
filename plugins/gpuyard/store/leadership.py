"""Leader leases, judged by the database's clock at the statement, and fenced by an epoch.

A replica leads a name (`scheduler`) while it holds that row's unexpired lease. Two things make this
safe when statements are held up on the network and clocks are skewed:

- The expiry is computed by the database when the statement runs (PostgreSQL's `clock_timestamp()`),
  never from a time the caller read earlier: a renewal delayed past its lease cannot take a lease
  that already passed to another replica, as if no time had gone by.
- The lease carries an `epoch` that grows each time the lead changes hands or lapses. A replica
  that sees a new epoch knows it lost the lead in between (and re-runs its recovery), and a write that
  only the leader may make (`confirm`) proves, inside its own transaction, that its epoch is still
  the current one: it locks the lease row, so the lead cannot change hands until the write commits,
  and the next leader's recovery sees whatever it wrote.
- A side effect outside the database (a launch, a stop signal, a release) is made inside such a
  transaction (`fenced`), after the write that records it: the lead cannot change hands while it
  happens, and a replica paused in the middle loses its transaction (and so its record) after
  `hold_s`, when the server ends it and the lead is free again.

On SQLite (one machine, one file) the database's clock is the caller's, passed as `now`.

Lock order: a transaction that confirms the lead locks the lease row first, before any job, attempt,
lease or fencing row (docs/concepts.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, case, func, literal, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from gpuyard.store.tables import UtcDateTime, leaders


class NotLeading(Exception):
    """The caller's lead has passed (another replica took it, or it lapsed): it must not write."""


@dataclass(frozen=True)
class Lead:
    """One replica's hold on a leader lease: the same lead for as long as the epoch is the same."""

    name: str
    holder: str
    epoch: int


def _now(conn: Connection, now: datetime, after_s: float = 0.0) -> ColumnElement[Any]:
    """The database's time when the statement runs, plus `after_s`."""
    if conn.dialect.name == "postgresql":
        return func.clock_timestamp() + timedelta(seconds=after_s)
    return literal(now + timedelta(seconds=after_s), UtcDateTime())


def hold(engine: Engine, name: str, holder: str, *, now: datetime, ttl_s: float) -> Lead | None:
    """Take or renew the named lease; the lead while `holder` has it, else None.

    The epoch stays while `holder` renews an unexpired lease and grows when it takes the lease from
    another holder or after a lapse (even its own: in between, nobody was sure to lead)."""
    with engine.begin() as conn:
        at, expires = _now(conn, now), _now(conn, now, ttl_s)
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        conn.execute(
            dialect.insert(leaders)
            .values(name=name, holder=holder, expires_at=expires, epoch=1)
            .on_conflict_do_nothing()
        )
        held = (leaders.c.holder == holder) & (leaders.c.expires_at >= at)
        epoch = conn.execute(
            update(leaders)
            .where(leaders.c.name == name, held | (leaders.c.expires_at < at))
            .values(
                holder=holder,
                expires_at=expires,
                epoch=case((held, leaders.c.epoch), else_=leaders.c.epoch + 1),
            )
            .returning(leaders.c.epoch)
        ).scalar_one_or_none()
    return None if epoch is None else Lead(name, holder, int(epoch))


def confirm(conn: Connection, lead: Lead, *, now: datetime) -> None:
    """Raise NotLeading unless `lead` is still the current, unexpired one; in the caller's transaction,
    first in it, and holding the lease row (shared) until it commits."""
    query = select(leaders.c.holder, leaders.c.epoch, leaders.c.expires_at > _now(conn, now)).where(
        leaders.c.name == lead.name
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(read=True)
    row = conn.execute(query).one_or_none()
    if row is None or (row[0], int(row[1])) != (lead.holder, lead.epoch) or not row[2]:
        raise NotLeading(f"{lead.holder} no longer leads {lead.name!r} (epoch {lead.epoch})")


@contextmanager
def fenced(
    engine: Engine, lead: Lead | None, *, now: datetime, hold_s: float | None = None
) -> Iterator[Connection]:
    """A transaction that only `lead` may commit: it confirms the lead first and holds the lease row
    until it commits, so whatever is written and done inside happens under that lead or not at all.
    `hold_s` bounds how long the transaction may wait on its caller (PostgreSQL ends it after that
    much idleness, releasing the lease row: a paused replica cannot hold the lead for ever). Without
    `lead` (one scheduler, no leaders) a plain transaction."""
    with engine.begin() as conn:
        if lead is not None:
            if hold_s is not None and conn.dialect.name == "postgresql":
                conn.execute(
                    text("SELECT set_config('idle_in_transaction_session_timeout', :ms, true)"),
                    {"ms": str(max(1000, round(hold_s * 1000)))},
                )
            confirm(conn, lead, now=now)
        yield conn
