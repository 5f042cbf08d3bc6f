"""`gpuyard submit | jobs | show | cancel | fleet | logs`: run jobs and follow them, through the API."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpuyard.cli.common import Api, api_command, call, fail, out, print_json
from gpuyard.cli.yaml_input import DocumentError, load_document

app = typer.Typer()


def gpus_shown(asked: Any) -> str:
    """A spec's `gpus` as the table shows it: `4`, or an elastic job's range `1-8`."""
    return f"{asked['min']}-{asked['max']}" if isinstance(asked, dict) else str(asked)


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("ID", "NAME", "TEAM", "STATE", "GPUS", "ATTEMPTS", "CREATED")
    for job in jobs:
        resources = job["spec"]["resources"]
        table.add_row(
            job["id"],
            job["name"],
            job["team"],
            job["state"],
            f"{gpus_shown(resources['gpus'])} x {','.join(resources['gpu_types']) or 'any'}",
            str(job["attempt_count"]),
            job["created_at"][:19].replace("T", " "),
        )
    return table


@api_command(app)
def submit(
    api: Api,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JobSpec YAML (or JSON).")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Resubmitting with the same key returns the same job.")
    ] = None,
) -> None:
    """Submit a job."""
    try:
        spec = load_document(file)
    except DocumentError as error:
        fail(str(error), code=2)
    with api.client() as client:
        job = call(client.submit, spec, idempotency_key=idempotency_key)
        if not api.as_json:
            out.print(
                f"submitted [bold]{job['id']}[/bold] ({job['name']}, team {job['team']}): {job['state']}"
            )
        if wait:
            with out.status(f"{job['id']}: {job['state']}") as status:
                job = call(
                    client.wait,
                    job["id"],
                    on_change=lambda j: status.update(
                        f"{j['id']}: {j['state']} (attempts: {j['attempt_count']})"
                    ),
                )
            if not api.as_json:
                out.print(
                    f"{job['id']} ended {job['state']}" + (f": {job['reason']}" if job["reason"] else "")
                )
    if api.as_json:
        print_json(job)
    if wait and job["state"] != "SUCCEEDED":
        raise typer.Exit(1)


@api_command(app)
def jobs(
    api: Api,
    team: Annotated[str | None, typer.Option(help="Only this team.")] = None,
    state: Annotated[str | None, typer.Option(help="Only this state (PENDING, RUNNING, ...).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 50,
) -> None:
    """List jobs, newest first."""
    api.show(api.call(lambda client: list(client.jobs(team=team, state=state, limit=limit))), jobs_table)


@api_command(app)
def show(api: Api, job_id: Annotated[str, typer.Argument(help="Job ID.")]) -> None:
    """Show a job with its attempts and events."""
    job = api.call(lambda client: client.job(job_id))
    if api.as_json:
        print_json(job)
        return
    out.print(jobs_table([job]))
    if job["reason"]:
        out.print(f"reason: {job['reason']}")
    if job["attempts"]:
        attempts = Table("ATTEMPT", "STATE", "PLACEMENT", "STEP", "CHECKPOINT", "EXIT", "REASON")
        for a in job["attempts"]:
            attempts.add_row(
                f"#{a['number']} {a['id']}",
                a["state"],
                json.dumps(a["placement"].get("nodes", a["placement"])),
                str(a["step"] or ""),
                str(a["checkpoint_step"] or ""),
                str(a["exit_code"] or ""),
                a["reason"] or "",
            )
        out.print(attempts)
    events = Table("SEQ", "AT", "EVENT", "DATA")
    for e in job["events"]:
        events.add_row(
            str(e["seq"]), (e["at"] or "")[:23].replace("T", " "), e["type"], json.dumps(e["data"])
        )
    out.print(events)


@api_command(app)
def cancel(api: Api, job_id: Annotated[str, typer.Argument(help="Job ID.")]) -> None:
    """Cancel a job (a running one is stopped by its launcher first)."""

    def line(job: dict[str, Any]) -> str:
        pending = " (stop requested)" if job["cancel_requested"] and job["state"] != "CANCELLED" else ""
        return f"{job['id']}: {job['state']}{pending}"

    api.show(api.call(lambda client: client.cancel(job_id)), line)


def fleet_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table("NODE", "SITE/CLUSTER/DOMAIN", "TYPE", "GPUS", "FREE", "LEASED", "SPOT", "PRICE/GPU-H")
    for n in nodes:
        table.add_row(
            n["name"],
            f"{n['site']}/{n['cluster']}/{n['domain']}",
            n["gpu_type"] + (" (CPU slots)" if n["gpu_type"] == "cpu" else ""),
            str(n["gpus"]),
            str(n["free_gpus"]),
            ",".join(map(str, n["leased_gpus"])) or "-",
            "yes" if n["preemptible"] else "no",
            f"{n['price_per_gpu_hour']:g}",
        )
    return table


@api_command(app)
def fleet(api: Api) -> None:
    """Show the fleet: nodes, their GPUs, and which are leased now."""
    api.show(api.call(lambda client: client.fleet()), fleet_table)


@api_command(app, json=False)
def logs(
    api: Api,
    job_id: Annotated[str, typer.Argument(help="Job ID.")],
    attempt: Annotated[int | None, typer.Option(help="Attempt number [default: the newest].")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")
    ] = False,
) -> None:
    """Print the workers' output of a job's attempt."""
    with api.client() as client:
        lines = client.logs(job_id, attempt=attempt, follow=follow)
        while (line := call(next, lines, None)) is not None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
