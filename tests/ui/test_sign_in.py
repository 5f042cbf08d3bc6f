"""One sign-in: the gpuyard page inside Airflow acts for the Airflow user the mapping names.

The mapping's rules and errors as pure functions; the delegation's cache on an injected clock; then
the page's app against a live `gpuyard up`, with JWTs signed by Airflow's own auth manager (the
simple one, as `airflow api-server` runs it) and validated by it through `sign_in.airflow_user`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gpuyard_client import Endpoint, GpuyardClient
from gpuyard_provider.ui import sign_in
from gpuyard_provider.ui.app import COOKIE, create_app
from gpuyard_provider.ui.sign_in import AirflowUser, Delegation, Grant, MappingError, parse_mapping
from stack import Gpuyard

MAPPING = {
    "users": {"alice": {"team": "a", "role": "member"}},
    "roles": {"Op": {"team": "b", "role": "team-admin"}, "Viewer": {"team": "b"}},
}


def test_a_user_s_own_entry_wins_then_the_first_role_in_the_mapping_s_order() -> None:
    mapping = parse_mapping(json.dumps(MAPPING))  # the connection's extra, as Airflow stores it
    assert mapping.token_minutes == 60
    alice = sign_in.grant_for(mapping, AirflowUser("alice", ("OP",)))
    assert alice == Grant(team="a", role="member", source="users.alice")  # her entry, not her role's
    both = sign_in.grant_for(mapping, AirflowUser("bob", ("VIEWER", "OP")))
    assert both == Grant(team="b", role="team-admin", source="roles.Op")  # Op is written first
    assert sign_in.grant_for(mapping, AirflowUser("carol", ("Viewer",))) == Grant(
        "b", "member", "roles.Viewer"
    )
    assert sign_in.grant_for(mapping, AirflowUser("dave", ("USER",))) is None
    assert sign_in.grant_for(mapping, AirflowUser("Alice", ())) is None  # user names are exact
    assert sign_in.grant_for(parse_mapping(None), AirflowUser("alice", ("ADMIN",))) is None


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("{not json", "extra: expected a JSON object, got text that is not JSON"),
        ("[]", "extra: expected a JSON object, got list"),
        ({"user": {}}, "user: unknown field; expected users, roles, token_minutes"),
        ({"users": []}, "users: expected an object of name -> {team, role}, got list"),
        ({"users": {"alice": "a"}}, 'users.alice: expected {"team": ..., "role": ...}, got \'a\''),
        ({"users": {"alice": {"role": "member"}}}, "users.alice.team: expected a gpuyard team name"),
        ({"users": {"alice": {"team": "Team A"}}}, "users.alice.team: expected a gpuyard team name"),
        (
            {"roles": {"Admin": {"team": "a", "role": "owner"}}},
            "roles.Admin.role: expected one of member, team-admin, platform-admin, got 'owner'",
        ),
        ({"roles": {"Admin": {"team": "a", "teams": []}}}, "roles.Admin.teams: unknown field"),
        (
            {"roles": {"Admin": {"team": "a"}, "ADMIN": {"team": "b"}}},
            "roles: 'Admin' and 'ADMIN' name the same",
        ),
        ({"token_minutes": 5}, "token_minutes: expected a whole number from 10 to 1440, got 5"),
        ({"token_minutes": "60"}, "token_minutes: expected a whole number from 10 to 1440, got '60'"),
        ({"token_minutes": True}, "token_minutes: expected a whole number"),
    ],
)
def test_a_bad_mapping_is_refused_naming_the_field(extra: Any, said: str) -> None:
    with pytest.raises(MappingError) as refused:
        parse_mapping(extra)
    assert said in str(refused.value)


def test_the_delegation_token_is_required_and_never_shown() -> None:
    with pytest.raises(MappingError, match="password: expected the delegation token"):
        sign_in.settings_of("", "{}")
    settings = sign_in.settings_of("gy_0123456789abcdef_secret", json.dumps(MAPPING))
    assert "secret" not in repr(settings)


def test_a_minted_token_is_kept_until_five_minutes_before_it_expires() -> None:
    now = [datetime(2026, 12, 7, 10, 0, tzinfo=UTC)]
    delegation = Delegation(clock=lambda: now[0])
    minted: list[datetime] = []

    def mint(expires_at: datetime) -> str:
        minted.append(expires_at)
        return f"token-{len(minted)}"

    alice = Delegation.key(AirflowUser("alice", ()), Grant("a", "member", "users.alice"), "http://api", "c")
    assert delegation.token(alice, 60, mint) == "token-1"
    assert minted == [now[0] + timedelta(minutes=60)]
    now[0] += timedelta(minutes=54)
    assert delegation.token(alice, 60, mint) == "token-1"  # 6 minutes left: kept
    now[0] += timedelta(minutes=1, seconds=1)
    assert delegation.token(alice, 60, mint) == "token-2"  # under 5 minutes left: a new one
    delegation.forget("token-2")  # the API refused it (revoked)
    assert delegation.token(alice, 60, mint) == "token-3"
    admin = Delegation.key(
        AirflowUser("alice", ()), Grant("a", "team-admin", "users.alice"), "http://api", "c"
    )
    assert delegation.token(admin, 60, mint) == "token-4"  # the mapping changed: a token of its grant
    rotated = Delegation.key(AirflowUser("alice", ()), Grant("a", "member", "users.alice"), "http://api", "d")
    assert delegation.token(rotated, 60, mint) == "token-5"  # a new delegation token mints anew


def test_the_roles_of_simple_and_fab_users() -> None:
    class Role:
        def __init__(self, name: str) -> None:
            self.name = name

    class FabUser:
        roles = [Role("Admin"), Role("Op")]

    class SimpleUser:
        role = "VIEWER"

    assert sign_in.roles_of(FabUser()) == ("Admin", "Op")
    assert sign_in.roles_of(SimpleUser()) == ("VIEWER",)
    assert sign_in.roles_of(object()) == ()


@pytest.fixture
def airflow_auth(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Airflow's simple auth manager in this process, signing with a secret of the test's own. Airflow's
    database is not here: its revocation list answers "not revoked", and says whom it was asked about."""
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "gpuyard-sign-in-test-" + "s" * 48)
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.models.revoked_token import RevokedToken

    asked: list[str] = []
    monkeypatch.setattr(RevokedToken, "is_revoked", classmethod(lambda cls, jti: asked.append(jti) or False))
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", SimpleAuthManager())
    yield airflow_app.get_auth_manager(), asked


def _jwt(manager: Any, username: str, role: str) -> str:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return str(manager.generate_jwt(SimpleAuthManagerUser(username=username, role=role)))


def _forged(username: str, role: str) -> str:
    """Airflow's claims, signed with another key."""
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    signer = JWTGenerator(secret_key="not-airflow-s-" + "k" * 50, valid_for=3600, audience="apache-airflow")
    return str(signer.generate({"sub": username, "role": role, "teams": []}))


@pytest.mark.slow  # a `gpuyard up`
def test_a_mapped_airflow_user_sees_its_team_without_signing_in(gpuyard: Gpuyard, airflow_auth: Any) -> None:
    manager, asked = airflow_auth
    with GpuyardClient(Endpoint(gpuyard.url, gpuyard.admin_token)) as admin:
        b_token = admin.create_token("b", description="team b's member, for the test")["token"]
    jobs = {}
    for team, token in (("a", gpuyard.token), ("b", b_token)):
        with gpuyard.client(gpuyard.admin_token) as admin:  # the teams may hold no GPU: their jobs wait
            quota = admin.get(f"/v1/teams/{team}").json()["quota"] | {"gpu_quota": 0}
            assert admin.put(f"/v1/teams/{team}/quota", json=quota).status_code == 200
        with GpuyardClient(Endpoint(gpuyard.url, token)) as member:
            jobs[team] = member.submit(
                {
                    "name": f"waits-{team}",
                    "team": team,
                    "image": "python:3.11-slim",
                    "command": ["python", "-c", "print('never placed')"],
                    "resources": {"gpus": 1, "gpu_types": ["cpu"], "nodes": 1},
                }
            )["id"]
    extra = [json.dumps(MAPPING)]  # the connection, read per request: the test edits it
    root = FastAPI()
    root.mount(
        "/gpuyard",
        create_app(
            lambda: gpuyard.url,
            airflow_user=sign_in.airflow_user,
            sign_in_settings=lambda: sign_in.settings_of(gpuyard.admin_token, extra[0]),
        ),
    )
    page = TestClient(root, base_url="http://airflow.test", follow_redirects=False)

    def headers(
        jwt: str | None = None, bearer: str | None = None, token: str | None = None
    ) -> dict[str, str]:
        cookies = [f"_token={jwt}"] if jwt else []  # as Airflow's UI sends it (scoped to Airflow's root)
        cookies += [f"{COOKIE}={token}"] if token else []
        return ({"Cookie": "; ".join(cookies)} if cookies else {}) | (
            {"Authorization": f"Bearer {bearer}"} if bearer else {}
        )

    def get(path: str, **who: str) -> Any:
        page.cookies.clear()
        return page.get(f"/gpuyard{path}", headers=headers(**who))

    def minted(user: str) -> list[dict[str, Any]]:
        with gpuyard.client(gpuyard.admin_token) as admin:
            listed = admin.get("/v1/tokens").json()
        return [t for t in listed if f"Airflow user {user} " in t["description"] and not t["revoked_at"]]

    alice = _jwt(manager, "alice", "OP")  # her own entry (team a, member) wins over Op's
    started = datetime.now(UTC)
    shown = get("/", jwt=alice)
    assert shown.status_code == 200, shown.text
    assert jobs["a"] in shown.text and jobs["b"] not in shown.text
    assert "team a · member · Airflow user" in shown.text and "alice" in shown.text
    assert "sign-out" not in shown.text  # nothing to sign out of: Airflow signed her in
    assert asked  # the auth manager validated the JWT and asked about its revocation
    [token] = minted("alice")
    assert (token["team"], token["role"]) == ("a", "member")
    assert "(users.alice)" in token["description"]
    lives = datetime.fromisoformat(token["expires_at"]) - started
    assert timedelta(minutes=59) < lives <= timedelta(minutes=61)
    assert get("/figures?hours=1", jwt=alice).status_code == 200
    assert len(minted("alice")) == 1  # kept: one token per Airflow user, not per request

    bob = _jwt(manager, "bob", "OP")  # by role, on the Authorization header, as Airflow's API takes it
    shown = get("/", bearer=bob)
    assert shown.status_code == 200 and jobs["b"] in shown.text and jobs["a"] not in shown.text
    [token] = minted("bob")
    assert (token["team"], token["role"]) == ("b", "team-admin")
    assert get(f"/jobs/{jobs['a']}", bearer=bob).text.count("Not Found") >= 1  # another team's job

    carol = _jwt(manager, "carol", "USER")  # no entry for her or her role
    assert get("/", jwt=carol).headers["location"] == "/gpuyard/sign-in"
    form = get("/sign-in", jwt=carol).text
    assert 'data-airflow-user="carol"' in form and "has no gpuyard team in this Airflow" in form
    assert 'name="token"' in form and minted("carol") == []

    for forged in (_forged("alice", "OP"), alice[:-4] + "AAAA", "not-a-jwt"):
        assert get("/", jwt=forged).headers["location"] == "/gpuyard/sign-in"  # no delegation
        assert get("/", bearer=forged).headers["location"] == "/gpuyard/sign-in"
        form = get("/sign-in", jwt=forged).text
        assert "data-airflow-user" not in form and 'name="token"' in form
    assert len(minted("alice")) == 1

    with gpuyard.client(gpuyard.admin_token) as admin:  # her minted token revoked: the page mints another
        assert admin.delete(f"/v1/tokens/{minted('alice')[0]['id']}").status_code == 204
    assert get("/", jwt=alice).headers["location"] == "/gpuyard/sign-in"
    assert "Signed in through Airflow as alice: team a, role member" in get("/sign-in", jwt=alice).text
    assert get("/", jwt=alice).status_code == 200 and len(minted("alice")) == 1

    extra[0] = json.dumps({"users": {"alice": {"team": "a", "role": "owner"}}})  # a malformed mapping
    form = get("/sign-in", jwt=alice).text
    assert "connection gpuyard_sign_in: users.alice.role: expected one of member" in form
    signed_in = page.post("/gpuyard/sign-in", data={"token": gpuyard.token}, headers=headers(jwt=alice))
    assert signed_in.status_code == 303 and COOKIE in signed_in.headers["set-cookie"]  # the form still works
    shown = get("/", jwt=alice, token=gpuyard.token)
    assert shown.status_code == 200 and jobs["a"] in shown.text and "sign-out" in shown.text
