"""`gpuyard`: run the control plane (up, api, relay), administer tokens, teams and secrets, run jobs."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import uvicorn
from rich.console import Console
from rich.table import Table

from gpuyard.bus.factory import make_bus
from gpuyard.cli.admin_client import AdminClient
from gpuyard.cli.yaml_input import DocumentError, load_document
from gpuyard.client import ApiError, NotConfigured, resolve_endpoint
from gpuyard.clock import utcnow
from gpuyard.domain.tokens import TokenLifetimeError
from gpuyard.domain.units import parse_duration
from gpuyard.settings import Settings, SettingsError, load_settings
from gpuyard.sim.cli import sim
from gpuyard.store import teams as team_store
from training.planner_cli import plan

if TYPE_CHECKING:
    from sqlalchemy import Engine

log = logging.getLogger("gpuyard.cli")
app = typer.Typer(help="gpuyard: a GPU training platform's control plane.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
team_app = typer.Typer(help="Teams: quotas and admission policies.", no_args_is_help=True)
app.add_typer(team_app, name="team")
secret_app = typer.Typer(help="A team's secrets, which jobs name in env_from_secret.", no_args_is_help=True)
app.add_typer(secret_app, name="secret")
kubernetes_app = typer.Typer(help="The Kubernetes launcher's cluster objects.", no_args_is_help=True)
app.add_typer(kubernetes_app, name="kubernetes")
# The planner lives with the worker runtime (training/); it is pure arithmetic, no torch import.
app.command("plan")(plan)
# The trace simulator drives the scheduler's own cycle with a virtual clock.
app.command("sim")(sim)

out = Console(width=None if sys.stdout.isatty() else 160)  # pipes and logs get whole tables
err = Console(stderr=True, soft_wrap=True)

Home = Annotated[
    Path | None,
    typer.Option("--home", help="State of the embedded instance [default: $GPUYARD_HOME or ~/.gpuyard]"),
]
Url = Annotated[str | None, typer.Option("--url", help="API URL [default: $GPUYARD_URL, else from --home]")]
Token = Annotated[
    str | None, typer.Option("--token", help="Bearer token [default: $GPUYARD_TOKEN, else --home's]")
]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _settings(home: Path | None, **overrides: Any) -> Settings:
    if home is not None:
        os.environ["GPUYARD_HOME"] = str(home)  # also where config.yaml is looked for
    try:
        settings = load_settings(**overrides)
    except SettingsError as error:
        _fail(str(error))
    settings.home.mkdir(parents=True, exist_ok=True)
    if settings.home.stat().st_uid == os.geteuid():
        settings.home.chmod(0o700)  # the store, the admin token, the secrets: the control plane's only
    return settings


def _server_settings(home: Path | None, **overrides: Any) -> Settings:
    """The settings of a server process (up, api, scheduler, relay, migrate), its logging set up."""
    settings = _settings(home, **overrides)
    settings.configure_logging()
    return settings


def _hidden(url: str | None) -> str:
    """A database URL fit for a log line: its password masked."""
    from sqlalchemy.engine import make_url

    return make_url(str(url)).render_as_string(hide_password=True)


def _fail(message: str, code: int = 1) -> Any:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def _store(settings: Settings) -> Engine:
    """The store, or a clear exit when its schema is not at head (production: run `gpuyard migrate`)."""
    from gpuyard.services import open_store
    from gpuyard.store.db import SchemaNotAtHead

    try:
        return open_store(settings)
    except SchemaNotAtHead as error:
        return _fail(str(error))


def _client(home: Path | None, url: str | None, token: str | None) -> AdminClient:
    try:
        return AdminClient(resolve_endpoint(url, token, home))
    except NotConfigured as error:
        return _fail(str(error))


def _call(function: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except ApiError as error:
        _fail(str(error), code=2 if error.status in (400, 409, 413, 422) else 1)
    except OSError as error:
        _fail(f"cannot reach the server: {error}")


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("ID", "NAME", "TEAM", "STATE", "GPUS", "ATTEMPTS", "CREATED")
    for job in jobs:
        resources = job["spec"]["resources"]
        table.add_row(
            job["id"],
            job["name"],
            job["team"],
            job["state"],
            f"{resources['gpus']} x {','.join(resources['gpu_types']) or 'any'}",
            str(job["attempt_count"]),
            job["created_at"][:19].replace("T", " "),
        )
    return table


@app.command()
def up(
    home: Home = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8080,
) -> None:
    """Run the embedded all-in-one control plane: API, outbox relay, scheduler and local launcher."""
    import threading

    from gpuyard.api.app import create_app
    from gpuyard.services import (
        AnnouncingServer,
        background,
        build_fleet,
        build_launcher,
        build_scheduler,
        ensure_admin_token,
        local_inventory,
        log_reader,
        relay_loop,
    )

    settings = _server_settings(home, host=host, port=port)
    engine = _store(settings)
    token_path = ensure_admin_token(engine, settings)
    bus = make_bus(settings)
    fleet = build_fleet(settings)
    try:
        scheduler = build_scheduler(settings, engine, build_launcher(settings), fleet, lambda: urls[0])
    except SettingsError as error:
        _fail(str(error))
    urls: list[str] = []
    stop = threading.Event()
    loop = threading.Thread(
        target=scheduler.run, args=(stop,), kwargs={"bus": bus}, name="scheduler", daemon=True
    )

    def ready(url: str) -> None:
        urls.append(settings.api_url or url)
        loop.start()
        out.print(
            f"gpuyard is up at [bold]{url}[/bold]  (store: {settings.database_url}, bus: {settings.bus})"
        )
        out.print(f"admin token: {token_path}  (clients find both through --home {settings.home})")
        where = "fleet file " + str(settings.fleet_file) if settings.fleet_file else "this machine"
        out.print(
            f"fleet ({where}): {local_inventory(settings).describe() if not settings.fleet_file else ''}"
            f"{len(fleet.nodes)} node(s); scheduler policy {settings.scheduler_policy}, local launcher"
        )

    server = AnnouncingServer(
        uvicorn.Config(
            create_app(settings, engine, fleet=fleet, logs=log_reader(settings)),
            host=host,
            port=port,
            log_level=settings.log_level.lower(),
            log_config=None,  # gpuyard's own logging (settings.configure_logging)
            access_log=False,
        ),
        settings.home,
        ready,
    )
    try:
        with background("relay", relay_loop(engine, bus, settings)):
            server.run()
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(timeout=10)


@app.command()
def scheduler(home: Home = None) -> None:
    """Run the scheduler alone (production). Replicas are safe: one leads, the others stand by."""
    import signal
    import threading

    from gpuyard.services import build_launcher, build_scheduler, fleet_source, probes

    settings = _server_settings(home)
    if settings.bus != "redis":
        _fail(
            "bus: a scheduler in its own process needs bus=redis (the in-process bus is inside `gpuyard up`)"
        )
    if not settings.api_url:
        _fail("api_url (GPUYARD_API_URL): workers need the API's address to send heartbeats")
    engine = _store(settings)
    try:
        service = build_scheduler(
            settings, engine, build_launcher(settings), fleet_source(settings), lambda: str(settings.api_url)
        )
    except SettingsError as error:
        _fail(str(error))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info(
        "scheduler %s: policy %s, launcher %s", service.holder, settings.scheduler_policy, settings.launcher
    )
    with probes(settings, engine, "scheduler"):
        service.run(stop, bus=make_bus(settings))


@app.command()
def api(
    home: Home = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port.")] = 8080,
    workers: Annotated[int, typer.Option(min=1, help="Server processes.")] = 2,
) -> None:
    """Run the HTTP API alone (production: run `gpuyard relay` beside it)."""
    settings = _server_settings(home)
    if settings.bus == "memory" and workers > 1:
        _fail("bus=memory lives inside one process: use `gpuyard up`, or set GPUYARD_BUS=redis")
    from gpuyard.services import multiprocess_metrics

    _store(settings).dispose()  # the schema is at head (or migrated, embedded) before workers start
    log.info("API workers share their metrics through %s", multiprocess_metrics(settings))
    uvicorn.run(
        "gpuyard.services:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level.lower(),
        log_config=None,  # each worker sets up gpuyard's logging (services.app_from_environment)
        access_log=False,
    )


@app.command()
def relay(home: Home = None) -> None:
    """Run the outbox relay alone (production). Several replicas may run at once."""
    import signal
    import threading

    from gpuyard.services import probes, relay_loop, relay_metrics

    settings = _server_settings(home)
    if settings.bus != "redis":
        _fail(
            "bus: a relay in its own process needs bus=redis (the in-process bus lives inside `gpuyard up`)"
        )
    engine = _store(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("relay: publishing %s -> stream %s", _hidden(settings.database_url), settings.redis_stream)
    relay_metrics(engine)
    with probes(settings, engine, "relay"):
        relay_loop(engine, make_bus(settings), settings)(stop)


@app.command()
def migrate(home: Home = None) -> None:
    """Bring the store's schema to this version's head (production: once per upgrade, as the
    gpuyard-migrate Job does). Concurrent runs take turns under a PostgreSQL advisory lock."""
    from sqlalchemy.exc import OperationalError

    from gpuyard.store.db import make_engine
    from gpuyard.store.db import migrate as upgrade

    def waiting() -> None:
        log.info("another migration holds the lock; waiting for it")

    settings = _server_settings(home)
    engine = make_engine(str(settings.database_url), pool_size=1, bounds=settings.db_bounds())
    where = _hidden(settings.database_url)
    log.info("migrating %s", where)
    try:
        before, after = upgrade(engine, on_wait=waiting)
    except OperationalError as error:
        _fail(f"database_url: cannot migrate {where}: {error.orig}")
    finally:
        engine.dispose()
    if before == after:
        log.info("schema already at head (%s)", after)
    else:
        log.info("schema migrated: %s -> %s", before or "empty", after)


@token_app.command("create")
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

    try:
        parsed_role = team_store.Role(role)
        dns_label(team)
        if len(description) > 200 or "\x00" in description:
            raise ValueError("--description: at most 200 characters, no NUL")
        lifetime = timedelta(seconds=parse_duration(expires_in)) if expires_in else None
    except (ValueError, OverflowError) as error:
        _fail(f"--role/--team/--description/--expires-in: {error}", code=2)
    settings = _settings(home)
    now = utcnow()
    try:
        expires_at = settings.tokens.expiry(now, now + lifetime if lifetime else None)
    except TokenLifetimeError as error:
        _fail(f"--expires-in: {error}", code=2)
    engine = _store(settings)
    with engine.begin() as conn:
        created = team_store.ensure_team(conn, team, settings.default_quota, now)
        token = team_store.create_token(conn, team, parsed_role, now, description, expires_at=expires_at)
    if as_json:
        _print_json(
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


@token_app.command("list")
def token_list(
    team: Annotated[str | None, typer.Option(help="This team's [default: yours; admins: all].")] = None,
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """List tokens (never their secrets): role, expiry, last use, revocation."""
    with _client(home, url, token) as client:
        found = _call(client.tokens, team)
    if as_json:
        _print_json(found)
        return
    table = Table("ID", "TEAM", "ROLE", "DESCRIPTION", "CREATED", "EXPIRES", "LAST USED", "REVOKED")
    for t in found:
        table.add_row(
            t["id"],
            t["team"],
            t["role"],
            t["description"],
            *(_when(t[k]) for k in ("created_at", "expires_at", "last_used_at", "revoked_at")),
        )
    out.print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="Token ID (the part after 'gy_', as `token list` shows).")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
) -> None:
    """Revoke a token: refused at once by the API process that answers, by every other within a second."""
    with _client(home, url, token) as client:
        _call(client.revoke_token, token_id)
    out.print(f"token {token_id} revoked")


def _when(value: str | None) -> str:
    return (value or "-")[:16].replace("T", " ")


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [item.strip() for item in value.split(",") if item.strip()]


def _show_teams(teams: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _print_json(teams)
    else:
        out.print(_team_table(teams))


def _team_table(teams: list[dict[str, Any]]) -> Table:
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


@team_app.command("list")
def team_list(home: Home = None, url: Url = None, token: Token = None, as_json: AsJson = False) -> None:
    """Teams you may see (yours; every team for platform admins) with quota and admission policy."""
    with _client(home, url, token) as client:
        found = _call(client.teams)
    _show_teams(found, as_json)


@team_app.command("show")
def team_show(
    name: Annotated[str, typer.Argument(help="Team name.")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """One team's quota and admission policy."""
    with _client(home, url, token) as client:
        found = _call(client.team, name)
    _show_teams([found], as_json)


@team_app.command("quota")
def team_quota(
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
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Set a team's quota (platform admins); options not given keep their current value."""
    with _client(home, url, token) as client:
        try:
            current = client.team(name)["quota"]
        except ApiError as error:
            if error.status != 404:
                _fail(str(error))
            current = {}
        given = {
            "gpu_quota": gpu_quota,
            "max_gpus_per_job": max_gpus_per_job,
            "allowed_gpu_types": _csv(gpu_types),
            "weight": weight,
        }
        quota = {**current, **{k: v for k, v in given.items() if v is not None}}
        if cohort is not None:
            quota["cohort"] = cohort or None  # '' leaves the cohort
        found = _call(client.set_quota, name, quota)
    _show_teams([found], as_json)


@team_app.command("policy")
def team_policy(
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
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Set a team's admission policy (platform admins); options not given keep their current value."""
    with _client(home, url, token) as client:
        current = _call(client.team, name)["policy"]
        given = {
            "allowed_registries": _csv(registries),
            "require_digest": require_digest,
            "allowed_priorities": _csv(priorities),
        }
        policy = {**current, **{k: v for k, v in given.items() if v is not None}}
        found = _call(client.set_policy, name, policy)
    _show_teams([found], as_json)


@secret_app.command("set")
def secret_set(
    name: Annotated[str, typer.Argument(help="Secret name (a DNS label), as jobs name it.")],
    team: Annotated[str, typer.Option(help="The secret's team.")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
) -> None:
    """Create or replace a secret; its value is read from standard input, never from the command line."""
    if sys.stdin.isatty():
        err.print(f"value of {team}/{name} (then Enter):")
    value = sys.stdin.readline().rstrip("\n") if sys.stdin.isatty() else sys.stdin.read()
    if not value:
        _fail("no value on standard input", code=2)
    with _client(home, url, token) as client:
        _call(client.put_secret, team, name, value)
    out.print(f"secret {team}/{name} stored; jobs read it with env_from_secret: {{VARIABLE: {name}}}")


@secret_app.command("list")
def secret_list(
    team: Annotated[str, typer.Option(help="The team.")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """The names of a team's secrets (values are never shown)."""
    with _client(home, url, token) as client:
        found = _call(client.secrets, team)
    if as_json:
        _print_json(found)
    else:
        out.print("\n".join(s["name"] for s in found) or f"team {team} has no secrets")


@secret_app.command("delete")
def secret_delete(
    name: Annotated[str, typer.Argument(help="Secret name.")],
    team: Annotated[str, typer.Option(help="The secret's team.")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
) -> None:
    """Delete a secret; jobs that name it are refused at submit, and fail to launch if already queued."""
    with _client(home, url, token) as client:
        _call(client.delete_secret, team, name)
    out.print(f"secret {team}/{name} deleted")


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JobSpec YAML (or JSON).")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Resubmitting with the same key returns the same job.")
    ] = None,
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Submit a job."""
    try:
        spec = load_document(file)
    except DocumentError as error:
        _fail(str(error), code=2)
    with _client(home, url, token) as client:
        job = _call(client.submit, spec, idempotency_key=idempotency_key)
        if not as_json:
            out.print(
                f"submitted [bold]{job['id']}[/bold] ({job['name']}, team {job['team']}): {job['state']}"
            )
        if wait:
            with out.status(f"{job['id']}: {job['state']}") as status:
                job = _call(
                    client.wait,
                    job["id"],
                    on_change=lambda j: status.update(
                        f"{j['id']}: {j['state']} (attempts: {j['attempt_count']})"
                    ),
                )
            if not as_json:
                out.print(
                    f"{job['id']} ended {job['state']}" + (f": {job['reason']}" if job["reason"] else "")
                )
    if as_json:
        _print_json(job)
    if wait and job["state"] != "SUCCEEDED":
        raise typer.Exit(1)


@app.command()
def jobs(
    team: Annotated[str | None, typer.Option(help="Only this team.")] = None,
    state: Annotated[str | None, typer.Option(help="Only this state (PENDING, RUNNING, ...).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 50,
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""
    with _client(home, url, token) as client:
        found = _call(lambda: list(client.jobs(team=team, state=state, limit=limit)))
    if as_json:
        _print_json(found)
    else:
        out.print(_jobs_table(found))


@app.command()
def show(
    job_id: Annotated[str, typer.Argument(help="Job ID.")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Show a job with its attempts and events."""
    with _client(home, url, token) as client:
        job = _call(client.job, job_id)
    if as_json:
        _print_json(job)
        return
    out.print(_jobs_table([job]))
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


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="Job ID.")],
    home: Home = None,
    url: Url = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Cancel a job (a running one is stopped by its launcher first)."""
    with _client(home, url, token) as client:
        job = _call(client.cancel, job_id)
    if as_json:
        _print_json(job)
    else:
        pending = " (stop requested)" if job["cancel_requested"] and job["state"] != "CANCELLED" else ""
        out.print(f"{job['id']}: {job['state']}{pending}")


@app.command()
def fleet(home: Home = None, url: Url = None, token: Token = None, as_json: AsJson = False) -> None:
    """Show the fleet: nodes, their GPUs, and which are leased now."""
    with _client(home, url, token) as client:
        nodes = _call(client.fleet)
    if as_json:
        _print_json(nodes)
        return
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
    out.print(table)


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="Job ID.")],
    attempt: Annotated[int | None, typer.Option(help="Attempt number [default: the newest].")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")
    ] = False,
    home: Home = None,
    url: Url = None,
    token: Token = None,
) -> None:
    """Print the workers' output of a job's attempt."""
    with _client(home, url, token) as client:
        lines = client.logs(job_id, attempt=attempt, follow=follow)
        while (line := _call(next, lines, None)) is not None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


@kubernetes_app.command("namespaces")
def kubernetes_namespaces(
    team: Annotated[
        list[str] | None, typer.Option("--team", help="Only this team (repeatable) [default: every team].")
    ] = None,
    home: Home = None,
) -> None:
    """Print the team namespaces (quota, worker identity, default-deny policy, the launcher's Role) as
    YAML for `kubectl apply -f -`, from the store's teams: run it as a cluster admin when a team is
    added or its quota changes."""
    import yaml

    from gpuyard.launchers.kubernetes import manifests

    settings = _settings(home)
    with _store(settings).connect() as conn:
        quotas = team_store.list_teams(conn)
    unknown = sorted(set(team or ()) - set(quotas))
    if unknown:
        _fail(
            f"--team: no such team in the store: {', '.join(unknown)} (teams: {', '.join(quotas) or 'none'})"
        )
    documents = []
    for name in team or sorted(quotas):
        gpus = manifests.team_gpu_limit(name, quotas)
        try:
            documents += manifests.build_team_namespace(name, gpus, settings.kubernetes)
        except ValueError as error:
            _fail(str(error))
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
