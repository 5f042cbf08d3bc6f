"""`gpuyard migrate` under its advisory lock, and production replicas that refuse an old schema.

The review saw every API replica run the migration at start with no lock: replicas started together
raced to create the same tables. Here real `gpuyard` processes run against a fresh PostgreSQL database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from gpuyard.store.db import MIGRATION_LOCK, current_revision, head_revision, make_engine
from servers import wait_until
from stores import throwaway_database

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # migrations as processes, racing for the lock


@pytest.fixture
def fresh_database(postgres_server: str) -> Iterator[str]:
    """A database nothing has migrated, dropped afterwards."""
    with throwaway_database(postgres_server, "gpuyard_migrate") as url:
        yield url


def gpuyard(command: str, database_url: str, home: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", command],
        env={
            **os.environ,
            "GPUYARD_HOME": str(home),
            "GPUYARD_DATABASE_URL": database_url,
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def revision(database_url: str) -> str | None:
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as connection:
            return current_revision(connection)
    finally:
        engine.dispose()


def test_three_migrations_at_once_take_turns_and_leave_one_schema(
    fresh_database: str, tmp_path: Path
) -> None:
    runs = [gpuyard("migrate", fresh_database, tmp_path / f"home-{i}") for i in range(3)]
    said = [run.communicate(timeout=120)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], said
    # Under the lock exactly one found the database empty; the others found it at head.
    assert sum(f"schema migrated: empty -> {head_revision()}" in s for s in said) == 1, said
    assert sum(f"schema already at head ({head_revision()})" in s for s in said) == 2, said
    assert revision(fresh_database) == head_revision()


def test_a_migration_waits_for_the_lock_and_says_so(fresh_database: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_database, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
        run = gpuyard("migrate", fresh_database, tmp_path)
        waiting = (
            # advisory locks are per database: another test's migration elsewhere is not this one
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            f"AND objid = {MIGRATION_LOCK} "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        wait_until(lambda: holder.execute(waiting).fetchone() == (1,), timeout_s=60, what="migrate to wait")
        assert revision(fresh_database) is None  # nothing was done while another held the lock
        holder.execute(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    assert "another migration holds the lock; waiting for it" in stderr
    assert revision(fresh_database) == head_revision()


@pytest.mark.parametrize("component", ["api", "relay"])
def test_a_production_replica_refuses_an_unmigrated_database(
    fresh_database: str, tmp_path: Path, component: str
) -> None:
    run = gpuyard(
        component,
        fresh_database,
        tmp_path,
        GPUYARD_PROFILE="production",
        GPUYARD_REDIS_URL="redis://127.0.0.1:6379/0",
    )
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, stderr
    assert "the database schema is at no revision (never migrated)" in stderr
    assert "run `gpuyard migrate`" in stderr
    assert revision(fresh_database) is None  # and it did not migrate it either
