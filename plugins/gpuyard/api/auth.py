"""Bearer-token authentication and the role rules.

A token is resolved through the context's TokenCache (half a second) and checked against its expiry
on every request, so neither a revoked nor an expired token outlives the cache by more than that.
Workers send their attempt's secret as the bearer credential of a heartbeat (`attempt_secret`); the
store checks it against the attempt's.
"""

from __future__ import annotations

from fastapi import Request

from gpuyard.api.context import ApiContext
from gpuyard.api.problems import Problem
from gpuyard.store import teams as team_store
from gpuyard.store.teams import Principal, Role

_CHALLENGE = {"WWW-Authenticate": "Bearer"}
MAX_TOKEN_LENGTH = 128  # ours are 63 characters; anything longer is not one of them


async def context(request: Request) -> ApiContext:
    # async: FastAPI would run a plain function in the thread pool, a hop on every request
    return request.app.state.context  # type: ignore[no-any-return]


def _bearer(request: Request) -> str:
    """The request's bearer credential; empty when it sends none."""
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


def unauthorized(detail: str) -> Problem:
    return Problem(401, "Unauthorized", detail, headers=_CHALLENGE)


async def principal(request: Request) -> Principal:
    """FastAPI dependency: the caller, or 401. The database is read on a cache miss only."""
    token = _bearer(request)
    if not token:
        raise unauthorized("send 'Authorization: Bearer <token>'")
    ctx: ApiContext = request.app.state.context
    found = None
    if len(token) <= MAX_TOKEN_LENGTH:

        def load(value: str) -> Principal | None:
            with ctx.engine.begin() as conn:  # a transaction: it may record the token's last use
                return team_store.authenticate(conn, value, ctx.clock())

        found = await ctx.principals.resolve_async(token, load)
    if found is None or found.expires_at <= ctx.clock():
        raise unauthorized("the bearer token is unknown, revoked or expired")
    return found


async def attempt_secret(request: Request) -> str:
    """FastAPI dependency: the secret a worker offers for its attempt (empty when none is sent; the
    heartbeat refuses that as it refuses a wrong one)."""
    return _bearer(request)


def require_platform_admin(caller: Principal) -> None:
    if not caller.is_platform_admin:
        raise Problem(403, "Forbidden", f"this needs role {Role.PLATFORM_ADMIN}, the token has {caller.role}")


def require_team_admin(caller: Principal, team: str) -> None:
    if caller.is_platform_admin or (caller.role == Role.TEAM_ADMIN and caller.team == team):
        return
    raise Problem(
        403, "Forbidden", f"this needs role {Role.TEAM_ADMIN} of team {team} or {Role.PLATFORM_ADMIN}"
    )
