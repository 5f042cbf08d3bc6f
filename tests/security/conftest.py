"""The security tests reuse the control-plane tests' fixtures: store and API, on SQLite and PostgreSQL."""

from __future__ import annotations

from control.conftest import (  # noqa: F401 (fixtures, found by pytest by name)
    _postgres_engine,
    api,
    database_url,
    engine,
    make_token,
    settings,
)
