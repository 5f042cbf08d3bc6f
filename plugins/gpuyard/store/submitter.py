"""The API's hot path: storing a submitted job and its `job.submitted` outbox event, atomically.

PostgreSQL: ONE statement (a data-modifying CTE commits both rows or neither) over an async psycopg
pool: one round trip per submit and no hop to a worker thread, which cost more than the insert.
Any other store (SQLite, the embedded default): `jobs.submit` in a worker thread.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Protocol

from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from gpuyard.domain.model import Job
from gpuyard.domain.spec import JobSpec
from gpuyard.store import jobs as job_store
from gpuyard.store.db import BoundedAsyncConnection, DbBounds


class Submitter(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def submit(
        self, spec: JobSpec, *, idempotency_key: str | None, created_by: str, at: datetime
    ) -> tuple[Job, bool]:
        """Store the job and its event. Returns (job, created); raises IdempotencyConflict."""
        ...


class ThreadedSubmitter:
    """`jobs.submit` through the engine, in a worker thread (SQLite's driver blocks)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def submit(
        self, spec: JobSpec, *, idempotency_key: str | None, created_by: str, at: datetime
    ) -> tuple[Job, bool]:
        return await run_in_threadpool(
            lambda: job_store.submit(
                self.engine, spec, idempotency_key=idempotency_key, created_by=created_by, at=at
            )
        )


# The same rows as jobs.submit writes; `job` is empty when the (team, key) pair exists already.
_SUBMIT = """
WITH job AS (
  INSERT INTO jobs (id, team, name, spec, spec_hash, idempotency_key, state, priority, gpus,
                    created_by, created_at, updated_at)
  VALUES (%(id)s, %(team)s, %(name)s, %(spec)s::json, %(spec_hash)s, %(idempotency_key)s, %(state)s,
          %(priority)s, %(gpus)s, %(created_by)s, %(created_at)s, %(updated_at)s)
  ON CONFLICT (team, idempotency_key) DO NOTHING
  RETURNING id, created_at)
INSERT INTO events (type, job_id, data, at)
SELECT 'job.submitted', id, %(event)s::json, created_at FROM job
RETURNING seq
"""


class PostgresSubmitter:
    """One autocommit statement per submit over a pool of async psycopg connections."""

    def __init__(self, engine: Engine, *, max_size: int, bounds: DbBounds, timeout_s: float = 5.0):
        self.engine = engine  # replays read the stored job through the common code
        # libpq's own URL: without SQLAlchemy's "+psycopg" driver suffix. Connections are made in
        # open(), inside the server's event loop.
        conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.pool = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_size,
            timeout=timeout_s,  # then PoolTimeout: the API answers 503, nothing was written
            # The engine's bounds: statement timeout, keepalives, and the client's wait limit.
            connection_class=BoundedAsyncConnection,
            kwargs={"autocommit": True, **bounds.connect_kwargs()},
            open=False,
        )

    async def open(self) -> None:
        await self.pool.open()

    async def close(self) -> None:
        await self.pool.close()

    async def submit(
        self, spec: JobSpec, *, idempotency_key: str | None, created_by: str, at: datetime
    ) -> tuple[Job, bool]:
        row = job_store.new_job_row(spec, idempotency_key=idempotency_key, created_by=created_by, at=at)
        params = {
            **row,
            "spec": json.dumps(row["spec"]),
            "event": json.dumps(job_store.submitted_event_data(spec)),
        }
        async with self.pool.connection() as conn:
            cursor = await conn.execute(_SUBMIT, params)
            if await cursor.fetchone() is not None:
                return job_store.job_from_mapping(row, spec), True
        # The key was used before (rare): the stored job, if the body is the same.
        return await run_in_threadpool(lambda: job_store.replay(self.engine, spec, str(idempotency_key)))


def submitter_for(engine: Engine, *, pool_size: int, bounds: DbBounds) -> Submitter:
    if engine.dialect.name == "postgresql":
        return PostgresSubmitter(engine, max_size=pool_size, bounds=bounds)
    return ThreadedSubmitter(engine)
