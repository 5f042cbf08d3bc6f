"""`gpuyard kubernetes namespaces`: the Kubernetes launcher's cluster objects, rendered from the store."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpuyard.cli.common import Home, fail, settings_for, store

app = typer.Typer(help="The Kubernetes launcher's cluster objects.", no_args_is_help=True)


@app.command("namespaces")
def kubernetes_namespaces(
    team: Annotated[
        list[str] | None, typer.Option("--team", help="Only this team (repeatable) [default: every team].")
    ] = None,
    site: Annotated[
        str | None,
        typer.Option(
            "--site", help="For this site's cluster (the `sites` setting) [default: `kubernetes`'s]."
        ),
    ] = None,
    home: Home = None,
) -> None:
    """Print the team namespaces (quota, worker identity, default-deny policy, the launcher's Role) as
    YAML for `kubectl apply -f -`, from the store's teams: run it as a cluster admin when a team is
    added or its quota changes (over several sites, once per site's cluster, with `--site`)."""
    import yaml

    from gpuyard.launchers.kubernetes import manifests
    from gpuyard.store import teams as team_store

    settings = settings_for(home)
    config = settings.kubernetes
    if site is not None:
        if site not in settings.sites:
            named = ", ".join(settings.sites) or "none"
            fail(f"--site: no such site in the `sites` setting: {site} (sites: {named})")
        config = settings.sites[site].kubernetes
    with store(settings).connect() as conn:
        quotas = team_store.list_teams(conn)
    unknown = sorted(set(team or ()) - set(quotas))
    if unknown:
        fail(
            f"--team: no such team in the store: {', '.join(unknown)} (teams: {', '.join(quotas) or 'none'})"
        )
    documents = []
    for name in team or sorted(quotas):
        gpus = manifests.team_gpu_limit(name, quotas)
        try:
            documents += manifests.build_team_namespace(name, gpus, config)
        except ValueError as error:
            fail(str(error))
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
