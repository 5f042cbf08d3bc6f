"""/v1/teams and /v1/tokens: quotas are data in the store, edited by platform admins."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Response

from gpuyard.api.auth import ApiContext, context, principal, require_platform_admin, require_team_admin
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem, not_found
from gpuyard.api.schemas import TeamOut, TokenIn, TokenOut
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import SpecRejected, dns_label
from gpuyard.store import teams as team_store
from gpuyard.store.teams import Principal, Role

router = APIRouter(prefix="/v1", tags=["admin"], responses=PROBLEM_RESPONSES)

TeamName = Path(min_length=1, max_length=63)


@router.get("/whoami")
def whoami(caller: Principal = Depends(principal)) -> dict[str, str]:
    return {"token_id": caller.token_id, "team": caller.team, "role": caller.role.value}


@router.get("/teams", response_model=list[TeamOut])
def list_teams(ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)) -> list[TeamOut]:
    with ctx.engine.connect() as conn:
        found = team_store.list_teams(conn)
    return [TeamOut(name=n, quota=q) for n, q in found.items() if caller.can_see(n)]


@router.get("/teams/{team}", response_model=TeamOut)
def show_team(
    team: str = TeamName, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> TeamOut:
    with ctx.engine.connect() as conn:
        quota = team_store.get_quota(conn, team) if caller.can_see(team) else None
    if quota is None:
        raise not_found(f"team {team}")
    return TeamOut(name=team, quota=quota)


@router.put("/teams/{team}/quota", response_model=TeamOut)
def set_quota(
    quota: TeamQuota,
    response: Response,
    team: str = TeamName,
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
) -> TeamOut:
    """Create the team or replace its quota (platform admins only)."""
    require_platform_admin(caller)
    _check_team_name(team)
    with ctx.engine.begin() as conn:
        created = team_store.set_quota(conn, team, quota, ctx.clock())
    ctx.quotas.forget(team)
    response.status_code = 201 if created else 200
    return TeamOut(name=team, quota=quota)


@router.post("/tokens", response_model=TokenOut, status_code=201)
def create_token(
    body: TokenIn, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> TokenOut:
    """A new token, shown once. Team admins mint tokens of their own team, up to their own role."""
    try:
        role = Role(body.role)
    except ValueError:
        raise SpecRejected.one(
            "role", f"expected one of {[r.value for r in Role]}, got {body.role!r}"
        ) from None
    require_team_admin(caller, body.team)
    if role == Role.PLATFORM_ADMIN:
        require_platform_admin(caller)
    _check_team_name(body.team)
    with ctx.engine.begin() as conn:
        team_store.ensure_team(conn, body.team, ctx.settings.default_quota, ctx.clock())
        token = team_store.create_token(conn, body.team, role, ctx.clock(), body.description)
    return TokenOut(id=token.split("_")[1], team=body.team, role=role.value, token=token)


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(
    token_id: str = Path(max_length=32),
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
) -> Response:
    with ctx.engine.begin() as conn:
        team = team_store.token_team(conn, token_id)
        if team is None or not caller.can_see(team):
            raise not_found(f"token {token_id}")
        require_team_admin(caller, team)
        if not team_store.revoke_token(conn, token_id, ctx.clock()):
            raise Problem(409, "Conflict", f"token {token_id} is already revoked")
    ctx.principals.clear()
    return Response(status_code=204)


def _check_team_name(team: str) -> None:
    try:
        dns_label(team)
    except ValueError as error:
        raise SpecRejected.one("team", str(error)) from None
