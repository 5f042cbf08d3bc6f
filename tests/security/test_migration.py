"""Migration 0004 on a store written before it: legacy tokens get an expiry, infinite weights a bound,
and on SQLite the team table is altered in place (a batch copy would drop a table that rows reference)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from gpuyard.store import teams as team_store
from gpuyard.store.db import MIGRATIONS, make_engine
from sqlalchemy import Engine, text


def upgrade(engine: Engine, revision: str, *, down: bool = False) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A database of the test's own, with no schema yet."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
        yield engine
        engine.dispose()
        return
    server: str = request.getfixturevalue("postgres_server")
    name = f"gpuyard_migration_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(server.rsplit("/", 1)[0] + "/" + name)
    yield engine
    engine.dispose()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_tokens_from_before_expire_and_weights_are_bounded(empty_store: Engine) -> None:
    engine = empty_store
    upgrade(engine, "0003")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO teams (name, max_gpus_per_job, allowed_gpu_types, gpu_quota, cohort, weight,"
                " created_at, updated_at) VALUES ('a', 8, '[]', 8, NULL, :inf, :now, :now)"
            ),
            {"inf": float("inf"), "now": now.isoformat()},  # text: Feast adapts datetimes globally
        )
        conn.execute(
            text(
                "INSERT INTO tokens (id, secret_hash, team, role, description, created_at)"
                " VALUES ('0123456789abcdef', 'x', 'a', 'member', '', :now)"
            ),
            {"now": (now - timedelta(days=400)).isoformat()},
        )
    upgrade(engine, "head")
    with engine.connect() as conn:
        (token,) = team_store.list_tokens(conn, "a")
        team = team_store.get_team(conn, "a")
    assert timedelta(days=89) < token.expires_at - now <= timedelta(days=90, minutes=1)
    assert team is not None and team.quota.weight == 1000 and team.policy.allowed_registries == ()
    upgrade(engine, "0003", down=True)  # and back, with the rows that reference the team in place
    upgrade(engine, "head")
