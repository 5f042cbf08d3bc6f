"""Fixtures of the Airflow tests (helpers in airflow_harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_harness import airflow_environment


@pytest.fixture
def airflow_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an Airflow whose state lives in the test's own AIRFLOW_HOME."""
    home = tmp_path / "airflow"
    home.mkdir()
    return airflow_environment(home)
