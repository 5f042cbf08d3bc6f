"""The security tests reuse the control-plane tests' fixtures: settings, store and API (on the stores of
tests/conftest.py: SQLite and PostgreSQL)."""

from __future__ import annotations

from control.conftest import (  # noqa: F401 (fixtures, found by pytest by name)
    api,
    engine,
    make_token,
    settings,
)
