"""schemathesis against /openapi.json: no input, valid or not, makes the API answer 500.

Cases come from schemathesis' strategies for every operation of the served schema, and are sent
over real HTTP to a running server with a platform-admin token: once on SQLite, once on PostgreSQL
(which refuses more: NUL characters, over-long strings, integers past BIGINT).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
import uvicorn
from gpuyard.api.app import create_app
from gpuyard.clock import utcnow
from gpuyard.settings import Settings, load_settings
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine, migrate
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from servers import wait_until


def _settings(home: Path, database_url: str | None = None) -> Settings:
    return load_settings(home=home, database_url=database_url or f"sqlite:///{home / 'gpuyard.db'}")


def _schema() -> schemathesis.BaseSchema:
    app = create_app(_settings(Path("/nonexistent")), make_engine("sqlite://"))
    return schemathesis.openapi.from_dict(app.openapi())


SCHEMA = _schema()
OPERATIONS = sorted(
    (op.path, op.method.upper()) for op in (result.ok() for result in SCHEMA.get_all_operations())
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    home = tmp_path_factory.mktemp("fuzz")
    postgres = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings_ = _settings(home, postgres)
    engine = make_engine(str(settings_.database_url))
    migrate(engine)
    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", settings_.default_quota, utcnow())
        token = team_store.create_token(conn, "a", team_store.Role.PLATFORM_ADMIN, utcnow())
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings_, engine), host="127.0.0.1", port=0, log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn to start")
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", token
    server.should_exit = True
    thread.join(timeout=10)
    engine.dispose()


def test_every_operation_is_fuzzed() -> None:
    assert ("/v1/jobs", "POST") in OPERATIONS and len(OPERATIONS) >= 10


@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_no_input_causes_a_server_error(path: str, method: str, server: tuple[str, str]) -> None:
    base_url, token = server
    headers = {"Authorization": f"Bearer {token}"}

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=SCHEMA[path][method].as_strategy())
    def check(case: schemathesis.Case) -> None:
        # A long poll (GET /v1/events?wait=S) holds an empty page up to S seconds: here, a moment.
        if isinstance(case.query, dict) and isinstance(case.query.get("wait"), int | float):
            case.query["wait"] = min(case.query["wait"], 0.2)
        response = case.call(base_url=base_url, headers=headers)
        case.validate_response(response, checks=[not_a_server_error], headers=headers)

    check()
