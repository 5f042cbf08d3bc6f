"""`gpuyard team list | show | quota | policy`: teams' quotas and admission policies, through the API."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from gpuyard_client import ApiError
from rich.table import Table

from gpuyard.cli.common import Api, api_command, call, fail

app = typer.Typer(help="Teams: quotas and admission policies.", no_args_is_help=True)


def csv(value: str | None) -> list[str] | None:
    return None if value is None else [item.strip() for item in value.split(",") if item.strip()]


def roots_by_site(value: str | None) -> dict[str, list[str]] | None:
    """'east=s3://a/x,east=s3://b/x,west=gs://c/x' -> {'east': [...], 'west': [...]}."""
    if value is None:
        return None
    roots: dict[str, list[str]] = {}
    for item in csv(value) or []:
        site, equals, root = item.partition("=")
        if not equals or not site or not root:
            fail(f"--checkpoint-roots: expected SITE=URL items, got {item!r}")
        roots.setdefault(site.strip(), []).append(root.strip())
    return roots


def teams_table(teams: list[dict[str, Any]]) -> Table:
    table = Table(
        "TEAM", "GPU QUOTA", "MAX/JOB", "GPU TYPES", "COHORT", "WEIGHT", "REGISTRIES", "DIGEST", "PRIORITIES"
    )
    for t in teams:
        q, p = t["quota"], t["policy"]
        table.add_row(
            t["name"],
            str(q["gpu_quota"]),
            str(q["max_gpus_per_job"]),
            ",".join(q["allowed_gpu_types"]) or "any",
            q["cohort"] or "-",
            f"{q['weight']:g}",
            ",".join(p["allowed_registries"]) or "any",
            "required" if p["require_digest"] else "-",
            ",".join(p["allowed_priorities"]) or "any",
        )
    return table


@api_command(app, "list")
def team_list(api: Api) -> None:
    """Teams you may see (yours; every team for platform admins) with quota and admission policy."""
    api.show(api.call(lambda client: client.teams()), teams_table)


@api_command(app, "show")
def team_show(api: Api, name: Annotated[str, typer.Argument(help="Team name.")]) -> None:
    """One team's quota and admission policy."""
    api.show([api.call(lambda client: client.team(name))], teams_table)


@api_command(app, "quota")
def team_quota(
    api: Api,
    name: Annotated[str, typer.Argument(help="Team name; created if new.")],
    gpu_quota: Annotated[int | None, typer.Option(help="Nominal concurrent GPUs.")] = None,
    max_gpus_per_job: Annotated[int | None, typer.Option(help="Largest job, in GPUs.")] = None,
    gpu_types: Annotated[
        str | None, typer.Option(help="Allowed GPU types, comma-separated; '' = any.")
    ] = None,
    cohort: Annotated[
        str | None, typer.Option(help="Cohort that lends and borrows quota; '' = none.")
    ] = None,
    weight: Annotated[float | None, typer.Option(help="Fair-share weight (0 < w <= 1000).")] = None,
) -> None:
    """Set a team's quota (platform admins); options not given keep their current value."""
    with api.client() as client:
        try:
            current = client.team(name)["quota"]
        except ApiError as error:
            if error.status != 404:
                fail(str(error))
            current = {}
        given = {
            "gpu_quota": gpu_quota,
            "max_gpus_per_job": max_gpus_per_job,
            "allowed_gpu_types": csv(gpu_types),
            "weight": weight,
        }
        quota = {**current, **{k: v for k, v in given.items() if v is not None}}
        if cohort is not None:
            quota["cohort"] = cohort or None  # '' leaves the cohort
        found = call(client.set_quota, name, quota)
    api.show([found], teams_table)


@api_command(app, "policy")
def team_policy(
    api: Api,
    name: Annotated[str, typer.Argument(help="Team name.")],
    registries: Annotated[
        str | None, typer.Option(help="Allowed registries, e.g. 'ghcr.io/acme,docker.io/library'; '' = any.")
    ] = None,
    require_digest: Annotated[
        bool | None, typer.Option("--require-digest/--no-require-digest", help="Images pinned by digest.")
    ] = None,
    priorities: Annotated[
        str | None, typer.Option(help="Allowed priority classes, e.g. 'low,normal'.")
    ] = None,
    checkpoint_roots: Annotated[
        str | None,
        typer.Option(
            help="Checkpoint roots per site, e.g. 'east=s3://ckpt-east/vision,west=gs://w/vision'; "
            "'' = every site's default, <its store>/<team>."
        ),
    ] = None,
) -> None:
    """Set a team's admission policy (platform admins); options not given keep their current value."""
    with api.client() as client:
        current = call(client.team, name)["policy"]
        given = {
            "allowed_registries": csv(registries),
            "require_digest": require_digest,
            "allowed_priorities": csv(priorities),
            "checkpoint_roots": roots_by_site(checkpoint_roots),
        }
        policy = {**current, **{k: v for k, v in given.items() if v is not None}}
        found = call(client.set_policy, name, policy)
    api.show([found], teams_table)
