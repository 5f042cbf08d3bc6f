"""Fixtures of the control-plane tests: a migrated store (SQLite and PostgreSQL) and an API client."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from faults.backends import SmallDisk
from gpuyard.api.app import create_app
from gpuyard.clock import utcnow
from gpuyard.settings import Settings, load_settings
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from sqlalchemy import Engine

# The documented example job (examples/flights-delay.yaml), as a submitted spec.
EXAMPLE_SPEC: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "flights-delay.yaml").read_text()
)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(home=tmp_path / "home", database_url=database_url, profile="embedded")


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = make_engine(str(settings.database_url), pool_size=8)  # at head already (database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def make_token(engine: Engine, settings: Settings) -> Callable[..., str]:
    def make(team: str = "a", role: str = "member") -> str:
        with engine.begin() as conn:
            team_store.ensure_team(conn, team, settings.default_quota, utcnow())
            return team_store.create_token(conn, team, team_store.Role(role), utcnow())

    return make


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 4 MB tmpfs of the test's own (a node's disk a test may fill); needs root, as make test has."""
    disk = SmallDisk(tmp_path / "node", size_mb=4)
    if os.geteuid() != 0 or not disk.mount():
        pytest.fail("this test mounts a tmpfs: it runs as root (as make test does here)")
    yield disk
    disk.unmount(tmp_path / "kept")


@pytest.fixture
def api(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(settings, engine)) as client:
        yield client


def bearer(token: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers}
