"""`gpuyard token create | list | revoke`: API tokens (create writes the store itself: the bootstrap)."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from gpuyard.cli.common import Api, AsJson, Home, api_command, err, fail, out, print_json, settings_for, store
from gpuyard.clock import utcnow
from gpuyard.domain.tokens import TokenLifetimeError
from gpuyard.domain.units import parse_duration

app = typer.Typer(help="API tokens.", no_args_is_help=True)


@app.command("create")
def token_create(
    team: Annotated[str, typer.Option(help="Team of the token; created with the default quota if new.")],
    role: Annotated[str, typer.Option(help="member, team-admin or platform-admin.")] = "member",
    description: Annotated[str, typer.Option(help="What the token is for.")] = "",
    expires_in: Annotated[
        str | None, typer.Option(help="Lifetime, e.g. 30d [default: the platform's, settings.tokens].")
    ] = None,
    home: Home = None,
    as_json: AsJson = False,
) -> None:
    """Create a token directly in the store and print it once (it is stored only as a hash)."""
    from gpuyard.domain.spec import dns_label
    from gpuyard.store import teams as team_store

    try:
        parsed_role = team_store.Role(role)
        dns_label(team)
        if len(description) > 200 or "\x00" in description:
            raise ValueError("--description: at most 200 characters, no NUL")
        lifetime = timedelta(seconds=parse_duration(expires_in)) if expires_in else None
    except (ValueError, OverflowError) as error:
        fail(f"--role/--team/--description/--expires-in: {error}", code=2)
    settings = settings_for(home)
    now = utcnow()
    try:
        expires_at = settings.tokens.expiry(now, now + lifetime if lifetime else None)
    except TokenLifetimeError as error:
        fail(f"--expires-in: {error}", code=2)
    engine = store(settings)
    with engine.begin() as conn:
        created = team_store.ensure_team(conn, team, settings.default_quota, now)
        token = team_store.create_token(conn, team, parsed_role, now, description, expires_at=expires_at)
    if as_json:
        print_json(
            {
                "team": team,
                "role": role,
                "token": token,
                "expires_at": expires_at.isoformat(),
                "team_created": created,
            }
        )
        return
    if created:
        err.print(f"created team {team} with the default quota {settings.default_quota.model_dump()}")
    err.print(f"token (shown once, store it now), valid until {expires_at:%Y-%m-%d %H:%M} UTC:")
    sys.stdout.write(token + "\n")


def when(value: str | None) -> str:
    return (value or "-")[:16].replace("T", " ")


def tokens_table(tokens: list[dict[str, Any]]) -> Table:
    table = Table("ID", "TEAM", "ROLE", "DESCRIPTION", "CREATED", "EXPIRES", "LAST USED", "REVOKED")
    for t in tokens:
        table.add_row(
            t["id"],
            t["team"],
            t["role"],
            t["description"],
            *(when(t[k]) for k in ("created_at", "expires_at", "last_used_at", "revoked_at")),
        )
    return table


@api_command(app, "list")
def token_list(
    api: Api,
    team: Annotated[str | None, typer.Option(help="This team's [default: yours; admins: all].")] = None,
) -> None:
    """List tokens (never their secrets): role, expiry, last use, revocation."""
    api.show(api.call(lambda client: client.tokens(team)), tokens_table)


@api_command(app, "revoke", json=False)
def token_revoke(
    api: Api,
    token_id: Annotated[str, typer.Argument(help="Token ID (the part after 'gy_', as `token list` shows).")],
) -> None:
    """Revoke a token: refused at once by the API process that answers, by every other within a second."""
    api.call(lambda client: client.revoke_token(token_id))
    out.print(f"token {token_id} revoked")
