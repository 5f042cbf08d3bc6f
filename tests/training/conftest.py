"""Fixtures for the training runtime tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainkit import write_flights


@pytest.fixture
def flights_parquet(tmp_path: Path) -> Path:
    """600 synthetic rows, written for each test: cheap, and a session-wide fixture would keep every
    training test on one xdist worker (tests/conftest.py groups the tests of a shared fixture)."""
    return write_flights(tmp_path / "flights.parquet")
