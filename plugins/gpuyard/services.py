"""Starting the control plane's processes: store, admin bootstrap, relay loop, HTTP server.

`gpuyard up` runs all of them in one process (the embedded default); production runs `gpuyard api`
and `gpuyard relay` as separate processes (replicas are safe).

Here the parts are composed from the settings' plain values, and here the names a setting gives a
part are checked against the parts' registries (`launcher` against LAUNCHERS, `scheduler_policy`
against POLICIES), as kube-scheduler checks a profile's plugin names when it builds the framework.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

import uvicorn
from gpuyard_client import ADMIN_TOKEN_FILE, SERVER_FILE
from sqlalchemy import Engine

from gpuyard import metrics
from gpuyard.api.app import create_app
from gpuyard.bus.base import EventBus
from gpuyard.clock import Clock, utcnow
from gpuyard.domain.fleet import Fleet
from gpuyard.domain.sites import Wan
from gpuyard.launchers import registry
from gpuyard.launchers.base import Launcher
from gpuyard.launchers.inventory import LocalInventory, discover
from gpuyard.observability import logs
from gpuyard.observability.probes import ProbeServer, loop_problem, store_problem
from gpuyard.relay import Relay
from gpuyard.scheduler.mover import CopyRules
from gpuyard.scheduler.policy import POLICIES, Policy
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings import MoveSettings, Settings, SettingsError, load_settings
from gpuyard.settings.sites import resolved_store_options
from gpuyard.store import outbox
from gpuyard.store import teams as team_store
from gpuyard.store.db import open_engine
from gpuyard.store.dbclock import database_clock
from gpuyard.store.outbox import count_unpublished

ADMIN_TEAM = "platform"
log = logging.getLogger(__name__)


def launcher_kind(settings: Settings) -> registry.LauncherKind:
    """The launcher registry's entry that `launcher` names; a name it does not hold is refused."""
    kind = registry.LAUNCHERS.get(str(settings.launcher))
    if kind is None:
        raise SettingsError(
            f"invalid settings: launcher: expected one of {sorted(registry.LAUNCHERS)}, "
            f"got {settings.launcher!r}"
        )
    return kind


def scheduler_policy(settings: Settings) -> Policy:
    """The policy that `scheduler_policy` names; a name POLICIES does not hold is refused."""
    policy = POLICIES.get(settings.scheduler_policy)
    if policy is None:
        raise SettingsError(
            f"scheduler_policy: expected one of {sorted(POLICIES)}, got {settings.scheduler_policy!r}"
        )
    return policy


def check_names(settings: Settings) -> None:
    """Refuse, as a server process starts, a launcher or scheduler policy no registry holds."""
    launcher_kind(settings)
    scheduler_policy(settings)


def configure_logging(settings: Settings) -> None:
    """The logging of a server process (up, api, scheduler, relay, migrate)."""
    logs.configure(settings.log_level, str(settings.log_format))


def ensure_admin_token(engine: Engine, settings: Settings) -> Path:
    """Keep a platform-admin token in `<home>/admin.token` (mode 0600) that this store accepts."""
    path = settings.home / ADMIN_TOKEN_FILE
    with engine.begin() as conn:
        if path.exists() and team_store.authenticate(conn, path.read_text().strip()):
            return path
        now = utcnow()
        team_store.ensure_team(conn, ADMIN_TEAM, settings.default_quota, now)
        token = team_store.create_token(  # renewed here once expired: the file holds a working token
            conn,
            ADMIN_TEAM,
            team_store.Role.PLATFORM_ADMIN,
            now,
            "embedded instance admin",
            expires_at=settings.tokens.expiry(now),
        )
    settings.home.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return path


@contextmanager
def background(name: str, loop: Callable[[threading.Event], None]) -> Any:
    """Run `loop(stop)` in a daemon thread for the duration of the block."""
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=10)


def relay_loop(
    engine: Engine, bus: EventBus, settings: Settings, *, in_process: bool = False
) -> Callable[[threading.Event], None]:
    """The relay's loop; `in_process`: the API writes events through the same engine (`gpuyard up`),
    and each commit that appended some wakes the relay."""
    wake = None
    if in_process:
        wake = threading.Event()
        outbox.on_events_committed(engine, wake.set)
    relay = Relay(engine, bus, batch_size=settings.relay_batch_size, wake=wake)
    return lambda stop: relay.run(
        stop, poll_s=settings.relay_poll_seconds, idle_poll_s=settings.relay_idle_poll_seconds
    )


class AnnouncingServer(uvicorn.Server):
    """A uvicorn server that writes `<home>/server.json` once it listens, and removes it on exit."""

    def __init__(self, config: uvicorn.Config, home: Path, on_ready: Callable[[str], None]):
        super().__init__(config)
        self.home, self.on_ready = home, on_ready

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.should_exit:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        url = f"http://{host}:{port}"
        (self.home / SERVER_FILE).write_text(json.dumps({"url": url, "pid": os.getpid()}))
        self.on_ready(url)

    async def shutdown(self, sockets: Any = None) -> None:
        with suppress(FileNotFoundError):
            (self.home / SERVER_FILE).unlink()
        await super().shutdown(sockets)


def probes(settings: Settings, engine: Engine, component: str) -> AbstractContextManager[Any]:
    """The probe and metrics server of the `scheduler` or `relay` process, on its port setting: alive
    while its loop goes round, ready while the store answers. A port that is taken (several replicas on
    one host; never in a pod of its own) costs the probes, not the component: it runs without them."""
    setting = f"{component}_probe_port"
    port = getattr(settings, setting)
    try:
        server = ProbeServer(
            settings.probe_host,
            port,
            alive=lambda: loop_problem(
                f"gpuyard_{component}_loop_timestamp_seconds", settings.probe_stall_seconds
            ),
            ready=lambda: store_problem(engine),
        )
    except OSError as error:
        log.error(
            "%s: cannot listen on %s:%s (%s); %s runs without probes or metrics (set %s to a free port, "
            "or 0 for any)",
            setting,
            settings.probe_host,
            port,
            error,
            component,
            setting,
        )
        return nullcontext()
    log.info("%s probes and metrics on %s (/healthz, /readyz, /metrics)", component, server.url)
    return server


def relay_metrics(engine: Engine) -> None:
    """The relay's scrape also says how many events wait (gpuyard_outbox_backlog)."""

    def backlog() -> int:
        with engine.connect() as conn:
            return count_unpublished(conn)

    metrics.collectors.register(metrics.OutboxCollector(backlog))


def multiprocess_metrics(settings: Settings) -> Path:
    """Before `gpuyard api` starts its workers: an empty PROMETHEUS_MULTIPROC_DIR (files a previous run
    left would add its counts to this one's), so a scrape of any worker sums all of them."""
    directory = Path(os.environ.get(metrics.MULTIPROC_DIR) or settings.home / "metrics")
    directory.mkdir(parents=True, exist_ok=True)
    for left in directory.glob("*.db"):  # prometheus_client's files; nothing else there is touched
        left.unlink()
    os.environ[metrics.MULTIPROC_DIR] = str(directory)  # inherited by the workers uvicorn spawns
    return directory


def local_inventory(settings: Settings) -> LocalInventory:
    return discover(settings.local_slots)


def build_fleet(settings: Settings) -> Fleet:
    """The fleet now: the fleet file when one is set, else what the launcher's source shows."""
    return fleet_source(settings)()


def fleet_source(settings: Settings) -> Callable[[], Fleet]:
    """What the scheduler reads before each pass: the fleet file when one is set (read once), else
    the launcher's own source (Kubernetes: the Nodes API, so cordoned, NotReady and removed nodes
    leave the fleet)."""
    kind = launcher_kind(settings)
    if settings.fleet_file:
        fleet = settings.fleet()
        return lambda: fleet
    try:
        return kind.fleet(settings)
    except registry.LauncherUnavailable as error:
        raise SettingsError(f"{error}; or set a fleet_file") from error


def log_reader(settings: Settings) -> Callable[[str, bool], Iterator[str]] | None:
    try:
        return launcher_kind(settings).logs(settings)
    except registry.LauncherUnavailable as error:
        raise SettingsError(str(error)) from error


def build_launcher(settings: Settings, clock: Clock, fleet: Callable[[], Fleet]) -> Launcher:
    """The launcher, built with the fleet source its scheduler reads (over several sites, it calls no
    site the fleet's reads found down)."""
    try:
        return launcher_kind(settings).build(settings, clock, fleet)
    except registry.LauncherUnavailable as error:
        raise SettingsError(str(error)) from error


def build_scheduler(
    settings: Settings,
    engine: Engine,
    fleet: Fleet | Callable[[], Fleet],
    api_url: Callable[[], str],
) -> SchedulerService:
    """The scheduler and its launcher, on one clock: the database's (a report stamped by this
    machine's wall clock, skewed, once recorded an attempt's start after its end)."""
    clock = database_clock(engine)
    source = fleet if callable(fleet) else (lambda: fleet)
    return SchedulerService(
        engine,
        build_launcher(settings, clock, source),
        source,
        api_url=api_url,
        policy=scheduler_policy(settings),
        clock=clock,
        lease_ttl_s=settings.lease_seconds,
        grace_s=settings.grace_seconds,
        checkpoint_stores=settings.checkpoint_stores,
        wan=wan(settings.moves),
        copy_rules=CopyRules(
            deadline_factor=settings.moves.deadline_factor,
            deadline_floor_s=settings.moves.deadline_floor_seconds,
            attempts=settings.moves.attempts,
            backoff_s=settings.moves.backoff_seconds,
        ),
        store_options=site_store_options(settings),
    )


def site_store_options(settings: Settings, env: Mapping[str, str] = os.environ) -> dict[str, dict[str, Any]]:
    """Each site's checkpoint store options, their references read (`from_env`, `from_file`);
    SettingsError naming the option that cannot be."""
    try:
        return {
            name: resolved_store_options(name, site.checkpoint_store_options, env)
            for name, site in settings.sites.items()
        }
    except ValueError as error:
        raise SettingsError(str(error)) from None


def wan(moves: MoveSettings) -> Wan | None:
    """The link between the fleet's sites, as the settings give it; None where they give no rate."""
    if moves.wan_gbit_s is None:
        return None
    return Wan(moves.wan_gbit_s, moves.wan_rtt_seconds, moves.egress_usd_per_gb)


def app_from_environment() -> Any:
    """ASGI factory for `gpuyard api` workers: settings come from the environment."""
    settings = load_settings()
    configure_logging(settings)
    engine = open_engine(settings, settings.db_pool_size)
    app = create_app(
        settings, engine, fleet=build_fleet(settings), logs=log_reader(settings), clock=database_clock(engine)
    )
    # What start-up built (modules, schemas, the app) lives as long as the worker: frozen, the
    # collector stops rescanning it, which cut the submit benchmark's p99 latency by a third.
    gc.collect()
    gc.freeze()
    return app
