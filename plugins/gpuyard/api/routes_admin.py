"""/v1/teams (quotas, admission policies, secrets) and /v1/tokens: data in the store, edited by admins.

Platform admins edit quotas and policies; team admins mint and revoke their team's tokens (up to
their own role) and write their team's secrets, whose values no response ever carries.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Response

from gpuyard.api.auth import ApiContext, context, principal, require_platform_admin, require_team_admin
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem, not_found
from gpuyard.api.schemas import SecretIn, SecretOut, TeamOut, TokenIn, TokenInfoOut, TokenOut
from gpuyard.domain.admission import AdmissionPolicy
from gpuyard.domain.checkpoint_roots import check_object_store_roots
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import SpecRejected, dns_label
from gpuyard.domain.tokens import TokenLifetimeError
from gpuyard.secrets.files import FileSecretStore
from gpuyard.store import teams as team_store
from gpuyard.store.teams import Principal, Role

router = APIRouter(prefix="/v1", tags=["admin"], responses=PROBLEM_RESPONSES)

TeamName = Path(min_length=1, max_length=63)
SecretName = Path(min_length=1, max_length=63)


@router.get("/whoami")
def whoami(caller: Principal = Depends(principal)) -> dict[str, str]:
    return {
        "token_id": caller.token_id,
        "team": caller.team,
        "role": caller.role.value,
        "expires_at": caller.expires_at.isoformat(),
    }


@router.get("/teams", response_model=list[TeamOut])
def list_teams(ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)) -> list[TeamOut]:
    """The caller's team (every team for platform admins), with quota and admission policy."""
    with ctx.engine.connect() as conn:
        names = [n for n in team_store.list_teams(conn) if caller.can_see(n)]
        found = [team_store.get_team(conn, n) for n in names]
    return [TeamOut(name=t.name, quota=t.quota, policy=t.policy) for t in found if t is not None]


@router.get("/teams/{team}", response_model=TeamOut)
def show_team(
    team: str = TeamName, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> TeamOut:
    with ctx.engine.connect() as conn:
        found = team_store.get_team(conn, team) if caller.can_see(team) else None
    if found is None:
        raise not_found(f"team {team}")
    return TeamOut(name=found.name, quota=found.quota, policy=found.policy)


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
    _check_name("team", team)
    with ctx.engine.begin() as conn:
        created = team_store.set_quota(conn, team, quota, ctx.clock())
        found = team_store.get_team(conn, team)
    ctx.teams.forget(team)
    response.status_code = 201 if created else 200
    assert found is not None
    return TeamOut(name=team, quota=found.quota, policy=found.policy)


@router.put("/teams/{team}/policy", response_model=TeamOut)
def set_policy(
    policy: AdmissionPolicy,
    team: str = TeamName,
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
) -> TeamOut:
    """Replace the team's admission policy: registries, digests, priority classes, checkpoint roots
    (platform admins only)."""
    require_platform_admin(caller)
    local = check_object_store_roots(policy.checkpoint_roots)
    if local and ctx.settings.checkpoints_in_object_store:
        raise SpecRejected(local)
    with ctx.engine.begin() as conn:
        changed = team_store.set_policy(conn, team, policy, ctx.clock())
        found = team_store.get_team(conn, team) if changed else None
    if found is None:
        raise not_found(f"team {team}")
    ctx.teams.forget(team)
    return TeamOut(name=found.name, quota=found.quota, policy=found.policy)


@router.post("/tokens", response_model=TokenOut, status_code=201)
def create_token(
    body: TokenIn, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> TokenOut:
    """A new token, shown once. Team admins mint tokens of their own team, up to their own role."""
    require_team_admin(caller, body.team)
    if body.role == Role.PLATFORM_ADMIN:
        require_platform_admin(caller)
    now = ctx.clock()
    try:
        expires_at = ctx.settings.tokens.expiry(now, body.expires_at)
    except TokenLifetimeError as error:
        raise SpecRejected.one("expires_at", str(error)) from None
    with ctx.engine.begin() as conn:
        team_store.ensure_team(conn, body.team, ctx.settings.default_quota, now)
        token = team_store.create_token(
            conn, body.team, body.role, now, body.description, expires_at=expires_at
        )
    return TokenOut(
        id=team_store.token_id_of(token),
        team=body.team,
        role=body.role.value,
        expires_at=expires_at,
        token=token,
    )


@router.get("/tokens", response_model=list[TokenInfoOut])
def list_tokens(
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    team: str | None = Query(None, max_length=63, description="Default: the caller's team; admins: all."),
) -> list[TokenInfoOut]:
    """Tokens with their expiry and last use, never their secrets (team admins: their team's)."""
    wanted = team if team is not None else (None if caller.is_platform_admin else caller.team)
    if wanted is None:
        require_platform_admin(caller)
    else:
        require_team_admin(caller, wanted)
    with ctx.engine.connect() as conn:
        return [TokenInfoOut.of(info) for info in team_store.list_tokens(conn, wanted)]


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(
    token_id: str = Path(max_length=32),
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
) -> Response:
    """Revoke a token: refused on this API process at once, on every other one within a second."""
    with ctx.engine.begin() as conn:
        team = team_store.token_team(conn, token_id)
        if team is None or not caller.can_see(team):
            raise not_found(f"token {token_id}")
        require_team_admin(caller, team)
        if not team_store.revoke_token(conn, token_id, ctx.clock()):
            raise Problem(409, "Conflict", f"token {token_id} is already revoked")
    ctx.principals.clear()
    return Response(status_code=204)


def _secret_store(ctx: ApiContext) -> FileSecretStore:
    if ctx.secrets is None:
        namespace = ctx.settings.kubernetes.namespace
        raise Problem(
            501,
            "Not Implemented",
            "this deployment keeps team secrets as Kubernetes Secrets: "
            f"kubectl -n {namespace} create secret generic gpuyard-team-<team> --from-literal=<name>=<value>",
            kind="/problems/secrets-in-kubernetes",
        )
    return ctx.secrets


@router.get("/teams/{team}/secrets", response_model=list[SecretOut])
def list_secrets(
    team: str = TeamName, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> list[SecretOut]:
    """The names of the team's secrets (members see them too: jobs name them)."""
    if not caller.can_see(team):
        raise not_found(f"team {team}")
    _check_name("team", team)
    return [SecretOut(team=team, name=name) for name in _secret_store(ctx).names(team)]


def _written_secret(
    team: str = TeamName, name: str = SecretName, caller: Principal = Depends(principal)
) -> tuple[str, str]:
    """The team and name of a secret being written, by one of the team's admins, with names a Secret
    can have."""
    require_team_admin(caller, team)
    _check_name("team", team)
    _check_name("name", name)
    return team, name


@router.put("/teams/{team}/secrets/{name}", response_model=SecretOut)
def put_secret(
    body: SecretIn,
    response: Response,
    secret: tuple[str, str] = Depends(_written_secret),
    ctx: ApiContext = Depends(context),
) -> SecretOut:
    """Create or replace a secret of the team (team admins). The value is never shown again."""
    team, name = secret
    with ctx.engine.connect() as conn:
        if team_store.get_team(conn, team) is None:
            raise not_found(f"team {team}")
    response.status_code = 201 if _secret_store(ctx).put(team, name, body.value) else 200
    return SecretOut(team=team, name=name)


@router.delete("/teams/{team}/secrets/{name}", status_code=204)
def delete_secret(
    secret: tuple[str, str] = Depends(_written_secret), ctx: ApiContext = Depends(context)
) -> Response:
    team, name = secret
    if not _secret_store(ctx).delete(team, name):
        raise not_found(f"secret {name} of team {team}")
    return Response(status_code=204)


def _check_name(path: str, value: str) -> None:
    try:
        dns_label(value)
    except ValueError as error:
        raise SpecRejected.one(path, str(error)) from None
