"""`gpuyard secret set | list | delete`: a team's secrets, which jobs name in env_from_secret."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpuyard.cli.common import Api, api_command, err, fail, out

app = typer.Typer(help="A team's secrets, which jobs name in env_from_secret.", no_args_is_help=True)
SecretName = Annotated[str, typer.Argument(help="Secret name (a DNS label), as jobs name it.")]
Team = Annotated[str, typer.Option(help="The secret's team.")]


@api_command(app, "set", json=False)
def secret_set(api: Api, name: SecretName, team: Team) -> None:
    """Create or replace a secret; its value is read from standard input, never from the command line."""
    if sys.stdin.isatty():
        err.print(f"value of {team}/{name} (then Enter):")
    value = sys.stdin.readline().rstrip("\n") if sys.stdin.isatty() else sys.stdin.read()
    if not value:
        fail("no value on standard input", code=2)
    api.call(lambda client: client.put_secret(team, name, value))
    out.print(f"secret {team}/{name} stored; jobs read it with env_from_secret: {{VARIABLE: {name}}}")


@api_command(app, "list")
def secret_list(api: Api, team: Team) -> None:
    """The names of a team's secrets (values are never shown)."""

    def names(found: list[dict[str, Any]]) -> str:
        return "\n".join(s["name"] for s in found) or f"team {team} has no secrets"

    api.show(api.call(lambda client: client.secrets(team)), names)


@api_command(app, "delete", json=False)
def secret_delete(api: Api, name: SecretName, team: Team) -> None:
    """Delete a secret; jobs that name it are refused at submit, and fail to launch if already queued."""
    api.call(lambda client: client.delete_secret(team, name))
    out.print(f"secret {team}/{name} deleted")
