"""Faults with nothing lost: the database unreachable, and 200 racing submissions with one key."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.settings import Settings, load_settings
from gpuyard.store.db import make_engine
from gpuyard.store.tables import events, jobs
from servers import TcpProxy, wait_until
from sqlalchemy import Engine, func, select

from .conftest import EXAMPLE_SPEC, bearer


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        job_count = conn.execute(select(func.count()).select_from(jobs)).scalar()
        submitted = conn.execute(select(func.count()).where(events.c.type == "job.submitted")).scalar()
    return int(job_count or 0), int(submitted or 0)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_database_unreachable_answers_503_and_writes_nothing_half(
    database_url: str, engine: Engine, make_token: Callable[..., str], tmp_path: Path
) -> None:
    target = urlsplit(database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    proxied_url = database_url.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}")
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


@pytest.fixture
def live_server(settings: Settings, engine: Engine) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, engine), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


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
        with lock:
            results.append((response.status_code, response.json().get("id", response.text)))

    threads = [threading.Thread(target=submit) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 199 + [201], statuses[:5]
    assert len({job_id for _, job_id in results}) == 1
    assert counts(engine) == (1, 1)
