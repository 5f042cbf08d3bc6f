"""Faults with nothing lost and every wait bounded: the database unreachable, slow or black-holed
(liveness still answers, statements end within their bounds), and 200 racing submissions with one key."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from faults.proxy import FaultProxy
from gpuyard.api.app import create_app
from gpuyard.settings import Settings, load_settings
from gpuyard.store.db import CLIENT_MARGIN_S, DbBounds, make_engine
from gpuyard.store.tables import events, jobs
from servers import TcpProxy, wait_until
from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import OperationalError

from .conftest import EXAMPLE_SPEC, bearer

pytestmark = pytest.mark.slow  # proxies, throwaway servers and waits for client bounds

Proxy = TypeVar("Proxy", TcpProxy, FaultProxy)


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        job_count = conn.execute(select(func.count()).select_from(jobs)).scalar()
        submitted = conn.execute(select(func.count()).where(events.c.type == "job.submitted")).scalar()
    return int(job_count or 0), int(submitted or 0)


def in_front_of(database_url: str, kind: type[Proxy]) -> tuple[Proxy, str]:
    """A started proxy of `kind` in front of the database, and the database's URL through the proxy."""
    target = urlsplit(database_url)
    proxy = kind(target.hostname or "127.0.0.1", target.port or 5432).start()
    return proxy, database_url.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_database_unreachable_answers_503_and_writes_nothing_half(
    database_url: str, engine: Engine, make_token: Callable[..., str], tmp_path: Path
) -> None:
    proxy, proxied_url = in_front_of(database_url, TcpProxy)
    settings = load_settings(home=tmp_path, database_url=proxied_url)
    proxied = make_engine(proxied_url, pool_size=4)
    token = make_token("a")
    with TestClient(create_app(settings, proxied)) as api:
        assert api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token)).status_code == 201
        proxy.cut()
        for key in ("during-1", "during-2"):
            response = api.post(
                "/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token, **{"Idempotency-Key": key})
            )
            assert response.status_code == 503, response.text
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["type"] == "/problems/database-unavailable"
        assert api.get("/readyz").status_code == 503
        assert api.get("/healthz").status_code == 200
        proxy.start()
        response = api.post(
            "/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token, **{"Idempotency-Key": "during-1"})
        )
        assert response.status_code == 201  # the failed attempt left nothing behind to replay
    proxied.dispose()
    proxy.cut()
    assert counts(engine) == (2, 2)


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """The app behind a real uvicorn server (its own event loop and thread pool); yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def live_server(settings: Settings, engine: Engine) -> Iterator[str]:
    with serving(create_app(settings, engine)) as url:
        yield url


def waiting_for_a_lock_on(engine: Engine, table: str) -> int:
    """Backends of this database waiting for a lock on `table` (the lock probe of the test)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "WHERE NOT l.granted AND c.relname = :table"
                ),
                {"table": table},
            ).scalar_one()
        )


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_liveness_answers_while_every_worker_thread_waits_for_the_database(
    settings: Settings, engine: Engine, make_token: Callable[..., str]
) -> None:
    # A database that does not answer holds every worker thread of the server; /healthz, which
    # the orchestrator restarts pods by, must not queue behind them.
    threads = 40  # anyio's default thread pool
    roomy = make_engine(str(settings.database_url), pool_size=threads // 2)  # a connection per thread
    token = make_token("a")
    with serving(create_app(settings, roomy)) as url, httpx.Client(base_url=url, timeout=60) as client:
        job = client.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token)).json()["id"]
        statuses: list[int] = []
        with engine.connect() as blocker:
            blocker.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            readers = [
                threading.Thread(
                    target=lambda: statuses.append(
                        httpx.get(f"{url}/v1/jobs/{job}", headers=bearer(token), timeout=60).status_code
                    )
                )
                for _ in range(threads + 5)
            ]
            for reader in readers:
                reader.start()
            wait_until(
                lambda: waiting_for_a_lock_on(engine, "jobs") == threads,
                what="every worker thread to wait for the lock",
            )
            started = time.monotonic()
            assert client.get("/healthz").json() == {"status": "ok"}
            assert time.monotonic() - started < 2
            assert waiting_for_a_lock_on(engine, "jobs") == threads  # all still held: nothing freed one
            blocker.rollback()
        for reader in readers:
            reader.join()
        assert statuses == [200] * (threads + 5)
    roomy.dispose()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_every_connection_carries_the_statement_timeout_and_keepalives(database_url: str) -> None:
    bounded = make_engine(database_url, bounds=DbBounds(statement_timeout_s=3, keepalive_s=9))
    with bounded.connect() as conn:
        shown = {
            name: conn.execute(text(f"SHOW {name}")).scalar_one()
            for name in ("statement_timeout", "idle_in_transaction_session_timeout", "tcp_keepalives_idle")
        }
        parameters = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    bounded.dispose()
    assert shown == {
        "statement_timeout": "3s",
        "idle_in_transaction_session_timeout": "1min",
        "tcp_keepalives_idle": "9",
    }
    assert (parameters["keepalives"], parameters["keepalives_idle"], parameters["tcp_user_timeout"]) == (
        "1",
        "9",
        str(round((3 + CLIENT_MARGIN_S) * 1000)),
    )


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_slow_statement_is_cancelled_by_the_server(database_url: str) -> None:
    bounded = make_engine(database_url, bounds=DbBounds(statement_timeout_s=1))
    started = time.monotonic()
    with pytest.raises(OperationalError, match="statement timeout"), bounded.connect() as conn:
        conn.execute(text("SELECT pg_sleep(30)"))
    assert time.monotonic() - started < 5
    bounded.dispose()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_black_holed_database_fails_within_the_client_bound_and_the_store_recovers(
    database_url: str, engine: Engine, make_token: Callable[..., str], tmp_path: Path
) -> None:
    # A link that accepts and never answers: the server never sees the statement (no statement
    # timeout fires) and a cancel request would vanish the same way, so the client must give up.
    proxy, proxied_url = in_front_of(database_url, FaultProxy)
    bounds = DbBounds(statement_timeout_s=1)
    proxied = make_engine(proxied_url, pool_size=4, bounds=bounds)
    token = make_token("a")
    settings = load_settings(home=tmp_path, database_url=proxied_url, db_statement_timeout_seconds=1)
    with TestClient(create_app(settings, proxied)) as api:
        assert api.get("/readyz").status_code == 200  # leaves one idle connection in the pool
        proxy.set("blackhole")
        started = time.monotonic()
        response = api.get("/v1/jobs", headers=bearer(token))  # on that connection
        assert response.status_code == 503, response.text
        assert bounds.wait_limit_s - 0.5 < time.monotonic() - started < bounds.wait_limit_s + 3
        started = time.monotonic()  # the submit path's own pool carries the same bound
        submitted = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token, **{"Idempotency-Key": "k"}))
        assert submitted.status_code == 503, submitted.text
        assert time.monotonic() - started < bounds.wait_limit_s + 3
        started = time.monotonic()
        assert api.get("/healthz").status_code == 200
        ready = api.get("/readyz")  # needs a new connection: the probe gives up first
        assert ready.status_code == 503 and "no answer within" in ready.json()["detail"]
        assert time.monotonic() - started < 4
        proxy.heal()
        assert api.get("/v1/jobs", headers=bearer(token)).status_code == 200  # a fresh connection
    proxied.dispose()
    proxy.stop()


def test_200_concurrent_submissions_with_one_key_make_one_job(
    live_server: str, engine: Engine, make_token: Callable[..., str]
) -> None:
    headers = bearer(make_token("a"), **{"Idempotency-Key": "race"})
    start = threading.Barrier(200)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def submit() -> None:
        with httpx.Client(base_url=live_server, timeout=60) as client:
            start.wait()
            response = client.post("/v1/jobs", json=EXAMPLE_SPEC, headers=headers)
            for _ in range(10):  # an overloaded database answers 503 Retry-After: clients ask again
                if response.status_code != 503:
                    break
                time.sleep(float(response.headers.get("Retry-After", "1")))
                response = client.post("/v1/jobs", json=EXAMPLE_SPEC, headers=headers)
        with lock:
            results.append((response.status_code, response.json().get("id", response.text)))

    threads = [threading.Thread(target=submit) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 199 + [201], [r for r in results if r[0] not in (200, 201)][:5]
    assert len({job_id for _, job_id in results}) == 1
    assert counts(engine) == (1, 1)
