"""The control plane's store for tests: a migrated SQLite template to copy, an empty PostgreSQL schema,
and what a worker reports to it."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

from gpuyard.domain.model import Attempt
from gpuyard.store.attempts import heartbeat
from gpuyard.store.db import make_engine, migrate
from gpuyard.store.tables import metadata
from local_cluster.services import throwaway_database
from sqlalchemy import Engine, text

__all__ = ["throwaway_database"]  # the tests' name for it


def migrated_sqlite(path: Path) -> Path:
    """A SQLite store at head in `path`, whole in its one file (nothing left in the WAL), to copy."""
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def empty_store(engine: Engine) -> None:
    """Delete every row of the store (the schema stays at head)."""
    names = ", ".join(t.name for t in metadata.sorted_tables)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        else:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())


def report_checkpoint(
    engine: Engine, attempt: Attempt, url: str, step: int, at: datetime, nbytes: int | None = None
) -> None:
    """The attempt's worker reports, in a heartbeat at `at`, the checkpoint of `step` it saved at `url`
    (of `nbytes`, where given)."""
    heartbeat(
        engine,
        attempt.id,
        attempt.fencing_token,
        secret=attempt.attempt_secret or "",
        step=step,
        checkpoint={"url": url, "step": step, "saved_at": at, "bytes": nbytes},
        at=at,
        lease_ttl_s=60,
    )
