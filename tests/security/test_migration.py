"""Migrations on a store written before them. 0004: legacy tokens get an expiry, infinite weights a
bound, and on SQLite the team table is altered in place (a batch copy would drop a table that rows
reference). 0007: every live attempt gets a secret of its own, an ended one none."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from control.conftest import EXAMPLE_SPEC
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.db import MIGRATIONS, make_engine
from gpuyard.store.tables import attempts
from sqlalchemy import Engine, insert, select, text


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


def test_live_attempts_get_a_secret_each_and_ended_ones_none(empty_store: Engine) -> None:
    engine = empty_store
    upgrade(engine, "0007")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", TeamQuota(), now)
    states = {"CREATED": None, "RUNNING": None, "LOST": None}
    for number, state in enumerate(states, start=1):
        job, _ = job_store.submit(
            engine, parse_spec(EXAMPLE_SPEC), idempotency_key=None, created_by="t", at=now
        )
        states[state] = f"{job.id}-a1"
        with engine.begin() as conn:
            conn.execute(
                insert(attempts).values(
                    id=states[state],
                    job_id=job.id,
                    number=1,
                    state=state,
                    fencing_token=number,
                    placement={},
                    created_at=now,
                    updated_at=now,
                )
            )
    upgrade(engine, "head")
    with engine.connect() as conn:
        secret = dict(conn.execute(select(attempts.c.id, attempts.c.attempt_secret)).all())
    created, running, lost = (secret[states[state]] for state in ("CREATED", "RUNNING", "LOST"))
    assert created and running and created != running and len(created) == len(running) == 43
    assert lost is None
    upgrade(engine, "0007", down=True)
    upgrade(engine, "head")
