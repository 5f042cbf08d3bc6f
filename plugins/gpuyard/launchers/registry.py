"""The launchers by name: each entry builds the launcher, its fleet source and its log reader.

`settings.launcher` picks one; `services.py` looks the name up here when it composes the parts, and
refuses a name this registry does not hold. A new launcher is one entry here (and its module), as
SkyPilot's recovery strategies and kube-scheduler's plugins are entries in a registry: nothing else
changes.
The fleet source is called again before each scheduling pass, so a fleet that changes (nodes
cordoned, NotReady or removed on Kubernetes) changes what the scheduler places on. A launcher is
built with the fleet source its scheduler reads: over several sites (the `sites` setting), the
Kubernetes launcher calls no site that the fleet's reads found down (launchers/sites.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from gpuyard.clock import Clock, utcnow
from gpuyard.domain.fleet import Fleet
from gpuyard.launchers.base import Launcher
from gpuyard.launchers.inventory import discover
from gpuyard.launchers.local import LocalLauncher, attempt_logs
from gpuyard.launchers.sites import SiteFleet, SiteLauncher, SiteLink
from gpuyard.secrets.files import home_store
from gpuyard.settings.kubernetes import KubernetesConfig

if TYPE_CHECKING:
    from gpuyard.settings import Settings

FleetSource = Callable[[], Fleet]
LogReader = Callable[[str, bool], Iterator[str]]


class LauncherUnavailable(RuntimeError):
    """The launcher cannot be built here (its cluster is unreachable, its settings are wrong)."""


@dataclass(frozen=True)
class LauncherKind:
    # (settings, clock, fleet): the clock stamps the launcher's reports, which the store records as
    # they are; the scheduler's is the database's (store/dbclock.py), never this machine's wall clock.
    # The fleet is the source the scheduler reads.
    build: Callable[[Settings, Clock, FleetSource], Launcher]
    fleet: Callable[[Settings], FleetSource]
    logs: Callable[[Settings], LogReader]


def attempts_dir(settings: Settings) -> Path:
    return settings.home / "attempts"


def _local_fleet(settings: Settings) -> FleetSource:
    fleet = discover(settings.local_slots).fleet()
    return lambda: fleet


def _local_logs(settings: Settings) -> LogReader:
    root = attempts_dir(settings)
    return lambda attempt_id, follow: attempt_logs(root / attempt_id, follow=follow)


def _local(settings: Settings, clock: Clock, fleet: FleetSource) -> Launcher:
    return LocalLauncher(
        attempts_dir(settings),
        discover(settings.local_slots),
        workdir=settings.worker_dir,
        secrets=home_store(settings.home),
        worker_users=settings.worker_users,
        passthrough=settings.worker_env_passthrough,
        clock=clock,
    )


def _store_teams(settings: Settings) -> Callable[[], list[str]]:
    """The store's team names, read when called: the Kubernetes launcher's team namespaces (it has no
    right to list namespaces)."""
    from gpuyard.store.db import DbBounds, make_engine
    from gpuyard.store.teams import list_teams

    engine = make_engine(str(settings.database_url), pool_size=1, bounds=DbBounds.from_settings(settings))

    def teams() -> list[str]:
        with engine.connect() as conn:
            return list(list_teams(conn))

    return teams


def _kubernetes_launchers(settings: Settings, clock: Clock = utcnow) -> dict[str, Launcher]:
    """A Kubernetes launcher per site, on the site's API; one on `kubernetes`' API without sites."""
    from gpuyard.launchers.kubernetes.launcher import KubernetesLauncher

    teams = _store_teams(settings)
    return {
        site: KubernetesLauncher(config, _kubernetes_api(config, site), teams=teams, clock=clock)
        for site, config in _clusters(settings).items()
    }


def _clusters(settings: Settings) -> dict[str, KubernetesConfig]:
    """Each site's cluster settings; without `sites`, the one cluster's (under the name "")."""
    return {name: site.kubernetes for name, site in settings.sites.items()} or {"": settings.kubernetes}


def _kubernetes(settings: Settings, clock: Clock, fleet: FleetSource) -> Launcher:
    launchers = _kubernetes_launchers(settings, clock)
    if not settings.sites:
        return launchers[""]
    down = fleet.down if isinstance(fleet, SiteFleet) else frozenset
    return SiteLauncher(launchers, down, clock=clock)


def _kubernetes_api(config: KubernetesConfig, site: str = ""):  # type: ignore[no-untyped-def]
    from gpuyard.launchers.kubernetes.launcher import load_api

    try:
        return load_api(config)
    except Exception as error:  # the client raises several kinds; all mean the same here
        where = f"sites.{site}.kubernetes: site {site}" if site else "launcher: kubernetes"
        raise LauncherUnavailable(
            f"{where} needs a reachable Kubernetes API (an in-cluster service account or a kubeconfig): "
            f"{error}"
        ) from error


def _kubernetes_fleet(settings: Settings) -> FleetSource:
    from gpuyard.launchers.kubernetes.fleet import fleet_from_nodes, site_nodes

    if not settings.sites:
        api = _kubernetes_api(settings.kubernetes)
        return lambda: fleet_from_nodes(api, settings.kubernetes)
    links = [
        SiteLink(
            name,
            partial(
                site_nodes, _kubernetes_api(site.kubernetes, name), site.kubernetes, name, site.data_prefixes
            ),
            site.kubernetes.request_timeout_s,
        )
        for name, site in settings.sites.items()
    ]
    return SiteFleet(links, settings.site_entries())


def _kubernetes_logs(settings: Settings) -> LogReader:
    launchers = _kubernetes_launchers(settings)
    pods = launchers[""] if not settings.sites else SiteLauncher(launchers)
    return lambda attempt_id, follow: pods.logs(attempt_id, follow=follow)


LAUNCHERS: dict[str, LauncherKind] = {
    "local": LauncherKind(build=_local, fleet=_local_fleet, logs=_local_logs),
    "kubernetes": LauncherKind(build=_kubernetes, fleet=_kubernetes_fleet, logs=_kubernetes_logs),
}
