"""One sign-in: inside Airflow, the gpuyard page acts for the signed-in Airflow user.

The platform team maps Airflow user names and Airflow roles to a gpuyard team and role (the mapping
is the policy: `parse_mapping`, `grant_for`) and hands the page a delegation token that may mint
tokens of those teams. For a mapped user the page mints a short-lived token of the mapped team and
role (`Delegation`), named after the Airflow user, and reads with it as it reads with a signed-in
person's token. Who the Airflow user is comes from the JWT Airflow's UI sends, validated by
Airflow's auth manager (`airflow_user`), never from a claim read unverified.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request

CONNECTION = "gpuyard_sign_in"  # password: the delegation token; extra: the mapping
ROLES = ("member", "team-admin", "platform-admin")  # gpuyard's roles, weakest first
DEFAULT_TOKEN_MINUTES = 60
TOKEN_MINUTES = (10, 24 * 60)  # the bounds of `token_minutes`
RENEW_BEFORE = timedelta(minutes=5)  # a cached token is replaced this long before it expires
_TEAM = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label, as the API names teams


class MappingError(ValueError):
    """The sign-in mapping is malformed; the message names the field, what it expected and what came."""


@dataclass(frozen=True)
class Grant:
    """What the mapping gives an Airflow user: a gpuyard team and role, and the entry that says so."""

    team: str
    role: str
    source: str  # `users.alice`, `roles.Admin`


@dataclass(frozen=True)
class SignInMapping:
    users: Mapping[str, Grant]
    roles: tuple[tuple[str, Grant], ...]  # in the order written: the first a user holds wins
    token_minutes: int = DEFAULT_TOKEN_MINUTES


@dataclass(frozen=True)
class AirflowUser:
    name: str
    roles: tuple[str, ...]


def parse_mapping(extra: str | Mapping[str, Any] | None) -> SignInMapping:
    """The mapping from the connection's extra (JSON text or an object): `users` and `roles`, each
    name -> {"team": T, "role": R} (role default `member`), and `token_minutes` (default 60)."""
    if isinstance(extra, str | bytes):
        try:
            extra = json.loads(extra) if extra.strip() else {}
        except json.JSONDecodeError as error:
            raise MappingError(
                f"extra: expected a JSON object, got text that is not JSON ({error})"
            ) from None
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise MappingError(f"extra: expected a JSON object, got {type(extra).__name__}")
    unknown = sorted(set(extra) - {"users", "roles", "token_minutes"})
    if unknown:
        raise MappingError(f"{unknown[0]}: unknown field; expected users, roles, token_minutes")
    minutes = extra.get("token_minutes", DEFAULT_TOKEN_MINUTES)
    low, high = TOKEN_MINUTES
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not low <= minutes <= high:
        raise MappingError(f"token_minutes: expected a whole number from {low} to {high}, got {minutes!r}")
    users = dict(_entries(extra, "users"))
    roles = tuple(_entries(extra, "roles"))
    seen: dict[str, str] = {}
    for name, _ in roles:
        if name.casefold() in seen:
            raise MappingError(f"roles: {seen[name.casefold()]!r} and {name!r} name the same Airflow role")
        seen[name.casefold()] = name
    return SignInMapping(users=users, roles=roles, token_minutes=minutes)


def _entries(extra: Mapping[str, Any], part: str) -> list[tuple[str, Grant]]:
    found = extra.get(part, {})
    if not isinstance(found, Mapping):
        raise MappingError(
            f"{part}: expected an object of name -> {{team, role}}, got {type(found).__name__}"
        )
    entries = []
    for name, entry in found.items():
        where = f"{part}.{name}"
        if not isinstance(entry, Mapping):
            raise MappingError(f'{where}: expected {{"team": ..., "role": ...}}, got {entry!r}')
        unknown = sorted(set(entry) - {"team", "role"})
        if unknown:
            raise MappingError(f"{where}.{unknown[0]}: unknown field; expected team, role")
        team, role = entry.get("team"), entry.get("role", "member")
        if not isinstance(team, str) or not _TEAM.fullmatch(team):
            raise MappingError(f"{where}.team: expected a gpuyard team name (a DNS label), got {team!r}")
        if role not in ROLES:
            raise MappingError(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}")
        entries.append((str(name), Grant(team=team, role=role, source=where)))
    return entries


def grant_for(mapping: SignInMapping, user: AirflowUser) -> Grant | None:
    """The user's own entry; else the first `roles` entry, in the mapping's order, whose Airflow role the
    user holds (role names compare without case: the simple auth manager says ADMIN, FAB Admin)."""
    if user.name in mapping.users:
        return mapping.users[user.name]
    held = {role.casefold() for role in user.roles}
    return next((grant for name, grant in mapping.roles if name.casefold() in held), None)


@dataclass(frozen=True)
class Minted:
    token: str
    expires_at: datetime


class Delegation:
    """Tokens minted for Airflow users, each kept until RENEW_BEFORE its expiry. The key holds the
    grant, the API and a digest of the delegation token: a changed mapping or credential mints anew."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._tokens: dict[tuple[str, ...], Minted] = {}
        self._lock = threading.Lock()  # the dictionary
        self._minting = threading.Lock()  # one mint at a time: two requests of a user mint once

    @staticmethod
    def key(user: AirflowUser, grant: Grant, api_url: str, credential: str) -> tuple[str, ...]:
        digest = hashlib.sha256(credential.encode()).hexdigest()
        return (user.name, grant.team, grant.role, api_url, digest)

    def token(self, key: tuple[str, ...], minutes: int, mint: Callable[[datetime], str]) -> str:
        """The cached token of `key`, or `mint(expires_at)`'s, minted to live `minutes`."""
        if (kept := self._fresh(key)) is not None:
            return kept
        with self._minting:
            if (kept := self._fresh(key)) is not None:
                return kept
            expires_at = self._clock() + timedelta(minutes=minutes)
            token = mint(expires_at)
            with self._lock:
                now = self._clock()
                self._tokens = {k: m for k, m in self._tokens.items() if m.expires_at > now}
                self._tokens[key] = Minted(token, expires_at)
            return token

    def forget(self, token: str) -> None:
        """Drop a token the API refused (revoked): the next request mints another."""
        with self._lock:
            self._tokens = {k: m for k, m in self._tokens.items() if m.token != token}

    def _fresh(self, key: tuple[str, ...]) -> str | None:
        with self._lock:
            kept = self._tokens.get(key)
        return kept.token if kept and kept.expires_at - self._clock() > RENEW_BEFORE else None


async def airflow_user(request: Request) -> AirflowUser | None:
    """The Airflow user the request is signed in as, as Airflow's own API finds it: an
    `Authorization: Bearer` JWT first, else the UI's `_token` cookie, validated by the auth manager
    (signature, expiry, audience, revocation). None outside Airflow's API server and for a missing or
    invalid JWT."""
    try:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
        from jwt import InvalidTokenError
    except ImportError:
        return None
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    token = credentials.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not token:
        return None
    try:
        manager = get_auth_manager()
    except RuntimeError:  # not initialized: not in Airflow's API server
        return None
    try:
        user = await manager.get_user_from_token(token)
    except InvalidTokenError:  # expired, forged, revoked: the auth manager logged why
        return None
    return AirflowUser(name=str(user.get_name()), roles=roles_of(user))


def roles_of(user: Any) -> tuple[str, ...]:
    """An Airflow user's role names: the simple auth manager's `role`, FAB's `roles`."""
    names = []
    if isinstance(role := getattr(user, "role", None), str):
        names.append(role)
    for each in getattr(user, "roles", None) or ():
        name = getattr(each, "name", each)
        if isinstance(name, str):
            names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class SignInSettings:
    """The `gpuyard_sign_in` connection: the mapping (its extra) and the delegation token (its
    password), which no repr, log or page shows."""

    mapping: SignInMapping
    credential: str = field(repr=False)


def settings_of(password: str | None, extra: str | Mapping[str, Any] | None) -> SignInSettings:
    if not password:
        raise MappingError(
            f"password: expected the delegation token (a gpuyard token that may mint the mapped teams' "
            f"tokens) in connection {CONNECTION}, got none"
        )
    return SignInSettings(parse_mapping(extra), password)
