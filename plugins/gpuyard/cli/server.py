"""`gpuyard up | api | scheduler | relay | migrate`: run the control plane's processes.

Each command imports what it runs (uvicorn, the bus, the services) when it runs: every `gpuyard`
command imports this module, and `gpuyard jobs` should not pay for a server's start-up."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuyard.cli.common import Home, fail, hidden, log, out, server_settings, store
from gpuyard.memory import run_on_c_allocator
from gpuyard.settings import SettingsError

app = typer.Typer()


@app.command()
def up(
    home: Home = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8080,
) -> None:
    """Run the embedded all-in-one control plane: API, outbox relay, scheduler and local launcher."""
    run_on_c_allocator()  # its scheduler reads backlogs (gpuyard/memory.py)
    import threading

    import uvicorn

    from gpuyard.api.app import create_app
    from gpuyard.bus.factory import make_bus
    from gpuyard.services import (
        AnnouncingServer,
        background,
        build_fleet,
        build_scheduler,
        ensure_admin_token,
        local_inventory,
        log_reader,
        relay_loop,
    )

    settings = server_settings(home, host=host, port=port)
    engine = store(settings)
    token_path = ensure_admin_token(engine, settings)
    bus = make_bus(settings)
    fleet = build_fleet(settings)
    try:
        scheduler = build_scheduler(settings, engine, fleet, lambda: urls[0])
    except SettingsError as error:
        fail(str(error))
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
            log_config=None,  # gpuyard's own logging (services.configure_logging)
            access_log=False,
        ),
        settings.home,
        ready,
    )
    try:
        with background("relay", relay_loop(engine, bus, settings, in_process=True)):
            server.run()
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(timeout=10)


@app.command()
def scheduler(home: Home = None) -> None:
    """Run the scheduler alone (production). Replicas are safe: one leads, the others stand by."""
    run_on_c_allocator()  # it reads backlogs (gpuyard/memory.py)
    import signal
    import threading

    from gpuyard.bus.factory import make_bus
    from gpuyard.services import build_scheduler, fleet_source, probes

    settings = server_settings(home)
    if settings.bus != "redis":
        fail(
            "bus: a scheduler in its own process needs bus=redis (the in-process bus is inside `gpuyard up`)"
        )
    if not settings.api_url:
        fail("api_url (GPUYARD_API_URL): workers need the API's address to send heartbeats")
    engine = store(settings)
    try:
        service = build_scheduler(settings, engine, fleet_source(settings), lambda: str(settings.api_url))
    except SettingsError as error:
        fail(str(error))
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
    settings = server_settings(home)
    if settings.bus == "memory" and workers > 1:
        fail("bus=memory lives inside one process: use `gpuyard up`, or set GPUYARD_BUS=redis")
    import uvicorn

    from gpuyard.services import multiprocess_metrics

    store(settings).dispose()  # the schema is at head (or migrated, embedded) before workers start
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

    from gpuyard.bus.factory import make_bus
    from gpuyard.services import probes, relay_loop, relay_metrics

    settings = server_settings(home)
    if settings.bus != "redis":
        fail("bus: a relay in its own process needs bus=redis (the in-process bus lives inside `gpuyard up`)")
    engine = store(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("relay: publishing %s -> stream %s", hidden(settings.database_url), settings.redis_stream)
    relay_metrics(engine)
    with probes(settings, engine, "relay"):
        relay_loop(engine, make_bus(settings), settings)(stop)


@app.command()
def migrate(home: Home = None) -> None:
    """Bring the store's schema to this version's head (production: once per upgrade, as the
    gpuyard-migrate Job does). Concurrent runs take turns under a PostgreSQL advisory lock."""
    from sqlalchemy.exc import OperationalError

    from gpuyard.store.db import migrate as upgrade
    from gpuyard.store.db import open_engine

    def waiting() -> None:
        log.info("another migration holds the lock; waiting for it")

    settings = server_settings(home)
    engine = open_engine(settings, pool_size=1)
    where = hidden(settings.database_url)
    log.info("migrating %s", where)
    try:
        before, after = upgrade(engine, on_wait=waiting)
    except OperationalError as error:
        fail(f"database_url: cannot migrate {where}: {error.orig}")
    finally:
        engine.dispose()
    if before == after:
        log.info("schema already at head (%s)", after)
    else:
        log.info("schema migrated: %s -> %s", before or "empty", after)
