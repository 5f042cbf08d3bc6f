"""Fixtures for the training runtime tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.data import write_synthetic


@pytest.fixture(scope="session")
def flights_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "flights.parquet"
    write_synthetic(str(path), rows=600, features=6, seed=3)
    return path
