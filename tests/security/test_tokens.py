"""API tokens expire, record their last use, and stop working on every API process within a second."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest
from control.conftest import bearer
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.api.context import TOKEN_TTL_S, TokenCache
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.settings import Settings
from gpuyard.store import teams as team_store
from sqlalchemy import Engine


class FakeTimer:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> list[datetime]:
    return [utcnow()]


@pytest.fixture
def clocked_api(settings: Settings, engine: Engine, clock: list[datetime]) -> Iterator[TestClient]:
    with TestClient(create_app(settings, engine, clock=lambda: clock[0])) as client:
        yield client


def token_of(engine: Engine, team: str, role: str = "member", **kwargs: datetime) -> str:
    with engine.begin() as conn:
        team_store.ensure_team(conn, team, TeamQuota(), utcnow())
        return team_store.create_token(conn, team, team_store.Role(role), utcnow(), **kwargs)


def test_a_token_stops_working_when_it_expires(
    clocked_api: TestClient, engine: Engine, clock: list[datetime]
) -> None:
    token = token_of(engine, "a", expires_at=clock[0] + timedelta(hours=1))
    assert clocked_api.get("/v1/whoami", headers=bearer(token)).status_code == 200  # now cached, too
    clock[0] += timedelta(hours=1, seconds=1)
    expired = clocked_api.get("/v1/whoami", headers=bearer(token))
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_lifetimes_have_a_platform_default_and_maximum(
    api: TestClient, make_token: Callable[..., str], settings: Settings
) -> None:
    admin = make_token("a", "team-admin")
    made = api.post("/v1/tokens", json={"team": "a"}, headers=bearer(admin))
    assert made.status_code == 201
    lifetime = datetime.fromisoformat(made.json()["expires_at"]) - utcnow()
    assert timedelta(days=settings.tokens.default_days - 1) < lifetime <= timedelta(days=90)
    for expires_at, fragment in (
        ((utcnow() + timedelta(days=366)).isoformat(), "at most 365 days"),
        ((utcnow() - timedelta(minutes=1)).isoformat(), "in the future"),
        ("2030-01-01T00:00:00", "timezone"),
    ):
        refused = api.post("/v1/tokens", json={"team": "a", "expires_at": expires_at}, headers=bearer(admin))
        assert refused.status_code == 422 and refused.json()["errors"][0]["path"] == "expires_at"
        assert fragment in refused.text, refused.text
    soon = (utcnow() + timedelta(days=7)).isoformat()
    kept = api.post("/v1/tokens", json={"team": "a", "expires_at": soon}, headers=bearer(admin))
    assert kept.status_code == 201 and kept.json()["expires_at"][:16] == soon[:16]


def test_a_revoked_token_is_refused_by_every_api_process_within_a_second(
    settings: Settings, engine: Engine, make_token: Callable[..., str]
) -> None:
    """Two apps on one store are two API processes; the second's cache runs on a clock of the test's."""
    member, admin = make_token("a"), make_token("a", "team-admin")
    timer = FakeTimer()
    with TestClient(create_app(settings, engine)) as here, TestClient(create_app(settings, engine)) as there:
        there.app.state.context.principals = TokenCache(timer=timer)  # type: ignore[attr-defined]
        assert there.get("/v1/whoami", headers=bearer(member)).status_code == 200  # cached there
        token_id = team_store.token_id_of(member)
        assert here.delete(f"/v1/tokens/{token_id}", headers=bearer(admin)).status_code == 204
        assert here.get("/v1/whoami", headers=bearer(member)).status_code == 401  # at once where revoked
        timer.now = TOKEN_TTL_S - 0.01
        assert there.get("/v1/whoami", headers=bearer(member)).status_code == 200  # the bound, not zero
        timer.now = TOKEN_TTL_S
        assert there.get("/v1/whoami", headers=bearer(member)).status_code == 401
    assert TOKEN_TTL_S <= 0.5  # with the time the revocation takes to commit: well within one second


def test_ten_thousand_bogus_tokens_do_not_evict_a_valid_one() -> None:
    valid = "gy_0123456789abcdef_" + "s" * 43
    principal = team_store.Principal("0123456789abcdef", "a", team_store.Role.MEMBER, utcnow())
    loads: list[str] = []

    def load(token: str) -> team_store.Principal | None:  # the store's answer, minus the store
        loads.append(token)
        return principal if token == valid else None

    cache = TokenCache(timer=FakeTimer())
    assert cache.resolve(valid, load) is principal
    for i in range(10_000):
        assert cache.resolve(f"gy_{i:016x}_" + "b" * 43, load) is None
    assert len(cache.unknown) == 4_096  # bounded: the oldest bogus entries went, and only they
    loads.clear()
    assert cache.resolve(valid, load) is principal and loads == []  # still cached: no read


def test_last_use_is_recorded_and_tokens_are_listed_by_their_team_admins(
    api: TestClient, make_token: Callable[..., str]
) -> None:
    member, team_admin, other_admin = (
        make_token("a"),
        make_token("a", "team-admin"),
        make_token("b", "team-admin"),
    )
    platform = make_token("platform", "platform-admin")
    assert api.get("/v1/whoami", headers=bearer(member)).status_code == 200
    listed = api.get("/v1/tokens", headers=bearer(team_admin))
    assert listed.status_code == 200
    by_id = {t["id"]: t for t in listed.json()}
    assert set(by_id) == {team_store.token_id_of(member), team_store.token_id_of(team_admin)}
    used = by_id[team_store.token_id_of(member)]
    assert used["last_used_at"] is not None and used["revoked_at"] is None
    assert not any(t.split("_", 2)[2] in listed.text for t in (member, team_admin))
    assert api.get("/v1/tokens", headers=bearer(member)).status_code == 403
    assert api.get("/v1/tokens?team=a", headers=bearer(other_admin)).status_code == 403
    everyone = api.get("/v1/tokens", headers=bearer(platform)).json()
    assert {t["team"] for t in everyone} == {"a", "b", "platform"}


def test_concurrent_misses_of_one_token_read_the_store_once() -> None:
    """A stampede when a popular token's entry expires: 32 requests, one read (the read is held open
    until every request waits on it)."""
    release, loads = threading.Event(), []

    def load(token: str) -> team_store.Principal | None:
        loads.append(token)
        release.wait(timeout=10)
        return None

    cache = TokenCache(timer=FakeTimer())

    async def stampede() -> list[team_store.Principal | None]:
        waiting = [asyncio.ensure_future(cache.resolve_async("gy_x", load)) for _ in range(32)]
        await asyncio.sleep(0)  # every request has reached its await
        release.set()
        return await asyncio.gather(*waiting)

    assert asyncio.run(stampede()) == [None] * 32 and loads == ["gy_x"]
