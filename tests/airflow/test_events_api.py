"""GET /v1/events: every event once and in order by cursor, per team, long polls, and the trusted head."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.clock import utcnow
from gpuyard.settings import load_settings
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from gpuyard.store.events import Head
from gpuyard.store.outbox import append_event
from servers import wait_until
from sqlalchemy import Engine

SPEC: dict[str, Any] = {
    "name": "follow-me",
    "team": "a",
    "image": "python:3.11-slim",
    "command": ["true"],
    "resources": {"gpus": 1, "gpu_types": ["cpu"]},
}


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, pool_size=8)
    yield engine
    engine.dispose()


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(home=tmp_path / "home", database_url=str(engine.url), profile="embedded")
    with TestClient(create_app(settings, engine)) as client:
        yield client


def token(engine: Engine, team: str, role: str = "member") -> dict[str, str]:
    with engine.begin() as conn:
        team_store.ensure_team(conn, team, load_settings().default_quota, utcnow())
        secret = team_store.create_token(conn, team, team_store.Role(role), utcnow())
    return {"Authorization": f"Bearer {secret}"}


def submit(api: TestClient, headers: dict[str, str], team: str = "a") -> str:
    response = api.post("/v1/jobs", json=SPEC | {"team": team}, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def walk(api: TestClient, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    """Every event by cursor, two per page."""
    seen, cursor = [], 0
    while True:
        page = api.get("/v1/events", params={"after": cursor, "limit": 2, **params}, headers=headers).json()
        seen += page["events"]
        assert page["cursor"] >= cursor
        if not page["events"]:
            return seen
        cursor = page["cursor"]


def test_cursor_walk_sees_every_event_once_in_order_and_per_team(api: TestClient, engine: Engine) -> None:
    a, b, admin = token(engine, "a"), token(engine, "b"), token(engine, "platform", "platform-admin")
    jobs_a = [submit(api, a) for _ in range(3)]
    job_b = submit(api, b, team="b")
    api.post(f"/v1/jobs/{jobs_a[0]}/cancel", headers=a)

    seen_a = walk(api, a)
    assert [e["seq"] for e in seen_a] == sorted({e["seq"] for e in seen_a})  # once each, in order
    assert {e["job_id"] for e in seen_a} == set(jobs_a)
    assert [e["type"] for e in seen_a if e["job_id"] == jobs_a[0]] == ["job.submitted", "job.cancelled"]
    assert {e["job_id"] for e in walk(api, b)} == {job_b}
    everything = walk(api, admin)
    assert {e["job_id"] for e in everything} == {*jobs_a, job_b}
    # The log through one job: the same events as the job's own record.
    detail = api.get(f"/v1/jobs/{jobs_a[0]}", headers=a).json()
    assert [e["seq"] for e in walk(api, a, job=jobs_a[0])] == [e["seq"] for e in detail["events"]]


def test_a_job_of_another_team_or_none_is_not_found(api: TestClient, engine: Engine) -> None:
    a, b = token(engine, "a"), token(engine, "b")
    job = submit(api, a)
    assert api.get("/v1/events", params={"job": job}, headers=b).status_code == 404
    assert api.get("/v1/events", params={"job": "job-0000"}, headers=a).status_code == 404
    assert api.get("/v1/events", params={"after": -1}, headers=a).status_code == 422
    assert api.get("/v1/events", params={"wait": 61}, headers=a).status_code == 422
    assert api.get("/v1/events").status_code == 401


def test_without_a_cursor_it_starts_from_now(api: TestClient, engine: Engine) -> None:
    a = token(engine, "a")
    submit(api, a)
    page = api.get("/v1/events", headers=a).json()
    assert page["events"] == [] and page["cursor"] >= 1
    job = submit(api, a)
    later = api.get("/v1/events", params={"after": page["cursor"]}, headers=a).json()
    assert [(e["job_id"], e["type"]) for e in later["events"]] == [(job, "job.submitted")]


def test_a_long_poll_answers_as_soon_as_its_event_arrives(api: TestClient, engine: Engine) -> None:
    a, b = token(engine, "a"), token(engine, "b")
    cursor = api.get("/v1/events", headers=a).json()["cursor"]
    answer: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        answer["page"] = api.get("/v1/events", params={"after": cursor, "wait": 30}, headers=a).json()
        answer["seconds"] = time.monotonic() - started

    poller = threading.Thread(target=poll)
    poller.start()
    feed = wait_until(lambda: getattr(api.app.state, "event_feed", None), what="the event feed")[1]
    wait_until(lambda: feed._waiters, what="the long poll to wait")
    submit(api, b, team="b")  # another team's event does not answer it
    job = submit(api, a)
    poller.join(timeout=30)
    assert [e["job_id"] for e in answer["page"]["events"]] == [job]
    assert answer["seconds"] < 10


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # SQLite's one writer commits in order
def test_the_head_waits_for_a_seq_still_in_flight(api: TestClient, engine: Engine) -> None:
    """PostgreSQL hands out seqs at insert and commits in any order: a reader must not pass a hole
    that may still fill, or it would never see that event."""
    a = token(engine, "a")
    job = submit(api, a)
    cursor = api.get("/v1/events", headers=a).json()["cursor"]
    slow = engine.connect()
    slow_tx = slow.begin()
    append_event(slow, type="test.slow", job_id=job, at=utcnow())  # takes seq cursor+1, uncommitted
    with engine.begin() as fast:
        append_event(fast, type="test.fast", job_id=job, at=utcnow())  # seq cursor+2, committed
    held = api.get("/v1/events", params={"after": cursor}, headers=a).json()
    assert held == {"events": [], "cursor": cursor}
    slow_tx.commit()
    slow.close()
    after = wait_until(
        lambda: api.get("/v1/events", params={"after": cursor}, headers=a).json()["events"],
        what="both events once the hole filled",
    )
    assert [e["type"] for e in after] == ["test.slow", "test.fast"]


def test_a_hole_that_never_fills_is_given_up_after_the_grace() -> None:
    head = Head(10)
    assert head.advance([11, 12, 14, 15], now=100.0, grace_s=5.0) == 12  # 13 may be in flight
    assert head.advance([14, 15], now=104.0, grace_s=5.0) == 12
    assert head.advance([13, 14, 15], now=104.5, grace_s=5.0) == 15  # it committed
    assert head.advance([17], now=200.0, grace_s=5.0) == 15
    assert head.advance([17, 18], now=205.0, grace_s=5.0) == 18  # 16 rolled back: given up
    assert head.holes == {}
