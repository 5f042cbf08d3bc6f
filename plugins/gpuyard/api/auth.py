"""Bearer-token authentication and the role rules."""

from __future__ import annotations

from fastapi import Request

from gpuyard.api.context import ApiContext
from gpuyard.api.problems import Problem
from gpuyard.store import teams as team_store
from gpuyard.store.teams import Principal, Role

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def context(request: Request) -> ApiContext:
    # async: FastAPI would run a plain function in the thread pool, a hop on every request
    return request.app.state.context  # type: ignore[no-any-return]


async def principal(request: Request) -> Principal:
    """FastAPI dependency: the caller, or 401. Cached briefly; the database is read on a miss only."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "Unauthorized", "send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    ctx: ApiContext = request.app.state.context

    def load(value: str) -> Principal | None:
        with ctx.engine.connect() as conn:
            return team_store.authenticate(conn, value)

    found = await ctx.principals.get_async(token.strip(), load)
    if found is None:
        raise Problem(401, "Unauthorized", "the bearer token is unknown or revoked", headers=_CHALLENGE)
    return found


def require_platform_admin(caller: Principal) -> None:
    if not caller.is_platform_admin:
        raise Problem(403, "Forbidden", f"this needs role {Role.PLATFORM_ADMIN}, the token has {caller.role}")


def require_team_admin(caller: Principal, team: str) -> None:
    if caller.is_platform_admin or (caller.role == Role.TEAM_ADMIN and caller.team == team):
        return
    raise Problem(
        403, "Forbidden", f"this needs role {Role.TEAM_ADMIN} of team {team} or {Role.PLATFORM_ADMIN}"
    )
