"""One scheduler over two clusters (the `sites` setting): each site its own API server (two emulators),
a launch goes to its placement's site, and a site whose API stops answering (black-holed: its
requests taken and never answered) is drained in the scheduler's view and stalls no pass on the
other site, bounded by its own request timeout; its attempt, no longer renewed, is held (it never
heartbeat) until the site answers, when its nodes come back and the attempt is released there."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import Result
from conftest import NAMESPACE, Cluster, detail, pods_of, step_until
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.launchers.sites import SiteFleet, SiteLauncher
from gpuyard.scheduler.service import SchedulerService
from gpuyard.services import build_launcher, build_scheduler, fleet_source, site_store_options
from gpuyard.settings import Settings, SettingsError, load_settings
from gpuyard.settings.kubernetes import KubernetesConfig
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from local_cluster.apiserver import ApiServer, write_kubeconfig
from servers import TcpProxy
from sqlalchemy import Engine
from stores import empty_store
from test_launcher import running
from typer.testing import CliRunner

pytestmark = pytest.mark.postgres

LEASE_S = 8.0
B_TIMEOUT_S = 2.0  # site b's request timeout: how long a pass may wait for its API


@dataclass
class TwoSites:
    a: Cluster
    b: Cluster
    b_link: TcpProxy  # the network between the scheduler and b's API server
    settings: Settings


def _cluster(server: ApiServer) -> Cluster:
    cluster = Cluster(server.emulator, server.loop, server.url)
    cluster.apply(m.build_team_namespace("a", 16, KubernetesConfig(namespace=NAMESPACE)))
    return cluster


@pytest.fixture
def store_url(postgres_url: str, _postgres_engine: Engine) -> Iterator[str]:
    """The session's PostgreSQL, emptied, team a given room for two 8-GPU jobs."""
    empty_store(_postgres_engine)
    with _postgres_engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=16, max_gpus_per_job=8), utcnow())
    yield postgres_url


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    engine = make_engine(store_url, pool_size=4)
    yield engine
    engine.dispose()


@pytest.fixture
def sites(tmp_path: Path, store_url: str) -> Iterator[TwoSites]:
    servers = [ApiServer(), ApiServer()]
    proxy = TcpProxy("127.0.0.1", int(servers[1].url.rsplit(":", 1)[1])).start()
    try:
        a, b = (_cluster(server) for server in servers)
        a.add_node("gpu-a")
        b.add_node("gpu-b")
        settings = load_settings(
            home=tmp_path / "home",
            database_url=store_url,
            launcher="kubernetes",
            lease_seconds=LEASE_S,
            kubernetes={
                "namespace": NAMESPACE,
                "in_cluster": False,
                "watch_timeout_s": 1,
                "request_timeout_s": 4,
            },
            sites={
                "a": {
                    "kubernetes": {"kubeconfig": str(write_kubeconfig(a.url, tmp_path / "a.kubeconfig"))},
                    "checkpoint_store": "s3://ckpt-a",
                    "checkpoint_store_options": {"endpoint_url": "http://s3.a:9000"},
                },
                "b": {
                    "kubernetes": {
                        "kubeconfig": str(
                            write_kubeconfig(f"http://127.0.0.1:{proxy.port}", tmp_path / "b.kubeconfig")
                        ),
                        "request_timeout_s": B_TIMEOUT_S,
                    },
                    "data_prefixes": ["s3://data-b/"],
                },
            },
        )
        yield TwoSites(a, b, proxy, settings)
    finally:
        proxy.heal()  # pipes held by the black hole let go
        proxy.cut()
        for server in reversed(servers):  # kmock's resolvers are stacked: the last started stops first
            server.stop()


@pytest.fixture
def service(sites: TwoSites, engine: Engine) -> Iterator[SchedulerService]:
    """The scheduler as `gpuyard scheduler` composes it: the registry's fleet and launcher of the sites."""
    fleet = fleet_source(sites.settings)
    launcher = build_launcher(sites.settings, utcnow, fleet)
    assert isinstance(fleet, SiteFleet) and isinstance(launcher, SiteLauncher)
    try:
        yield SchedulerService(
            engine, launcher, fleet, api_url=lambda: "http://api", lease_ttl_s=LEASE_S, grace_s=0
        )
    finally:
        launcher.close()
        fleet.close()


def submit_at(engine: Engine, site: str) -> str:
    spec = {
        "name": f"at-{site}",
        "team": "a",
        "image": "registry.example/train:1",
        "command": ["sh", "-c", "sleep 600"],  # never heartbeats
        "resources": {"gpus": 8, "gpu_types": ["h100"]},
        "sites": [site],
    }
    job, _ = job_store.submit(engine, parse_spec(spec), idempotency_key=None, created_by="t", at=utcnow())
    return job.id


def run_at(cluster: Cluster, service: SchedulerService, engine: Engine, job_id: str) -> str:
    """The job's attempt, launched at `cluster` and running there (the test plays its kubelet)."""
    step_until(service, lambda: detail(engine, job_id).attempts, "an attempt")
    attempt_id = detail(engine, job_id).attempts[-1].id
    step_until(service, lambda: pods_of(cluster, attempt_id), "its pod")
    for name in pods_of(cluster, attempt_id):
        cluster.set_pod_status(name, running())
    step_until(service, lambda: detail(engine, job_id).job.state.value == "RUNNING", "running")
    return attempt_id


def timed_step(service: SchedulerService) -> float:
    started = time.monotonic()
    service.step()
    return time.monotonic() - started


def test_the_sites_setting_is_checked_field_by_field(tmp_path: Path) -> None:
    def load(sites: object, **others: object) -> Settings:
        return load_settings(home=tmp_path, launcher="kubernetes", sites=sites, **others)

    cases = {
        r"sites.B_1.\[key\]: expected a lowercase DNS label": {"B_1": {}},
        r"sites.a.kubernetes.kubecfg: Extra inputs": {"a": {"kubernetes": {"kubecfg": "/k"}}},
        r"sites.a.datas: Extra inputs": {"a": {"datas": []}},
        r"sites: a, b all say in_cluster: true, but only one site": {"a": {}, "b": {}},
        r"sites.b.kubernetes: reaches the same API as site a \(kubeconfig /k, context current\)": {
            "a": {"kubernetes": {"in_cluster": False, "kubeconfig": "/k"}},
            "b": {"kubernetes": {"in_cluster": False, "kubeconfig": "/k"}},
        },
        r"sites.a.kubernetes.request_timeout_s: 31 s is over half the lease \(30 s\)": {
            "a": {"kubernetes": {"request_timeout_s": 31}}
        },
        r"sites.a.checkpoint_store: expected": {"a": {"checkpoint_store": "ckpt"}},
        r"sites.a.checkpoint_store_options: Input should be a valid dictionary": {
            "a": {"checkpoint_store_options": ["endpoint_url"]}
        },
        r"sites.a.checkpoint_store_options: .*secret: a reference is one of": {
            "a": {"checkpoint_store_options": {"secret": {"from_env": "S", "from_file": "/s"}}}
        },
        r"sites.a.checkpoint_store_options: .*key: a reference is one of": {
            "a": {"checkpoint_store_options": {"key": {"from_env": ""}}}
        },
    }
    for message, value in cases.items():
        with pytest.raises(SettingsError, match=message):
            load(value)
    with pytest.raises(SettingsError, match=r"sites: each site is a cluster .* the local launcher"):
        load_settings(home=tmp_path, launcher="local", sites={"a": {}})
    # a site's cluster is the shared settings with its own fields laid over them
    settings = load(
        {"a": {}, "b": {"kubernetes": {"in_cluster": False, "context": "b", "namespace": "gy-b"}}},
        kubernetes={"namespace": "gy", "master_port": 30000},
    )
    a, b = settings.sites["a"].kubernetes, settings.sites["b"].kubernetes
    assert (a.namespace, a.in_cluster, a.master_port) == ("gy", True, 30000)
    assert (b.namespace, b.in_cluster, b.context, b.master_port) == ("gy-b", False, "b", 30000)


def test_a_sites_store_credentials_are_read_from_the_environment_or_a_file_as_the_scheduler_starts(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")  # as a mounted Secret's file: its newline is not the secret's
    options = {
        "endpoint_url": "http://s3.b:9000",
        "key": {"from_env": "SITE_B_KEY"},
        "secret": {"from_file": str(secret)},
    }
    settings = load_settings(
        home=tmp_path, launcher="kubernetes", sites={"b": {"checkpoint_store_options": options}}
    )
    assert settings.sites["b"].checkpoint_store_options == options  # the settings hold no credential
    assert site_store_options(settings, {"SITE_B_KEY": "k"}) == {
        "b": {"endpoint_url": "http://s3.b:9000", "key": "k", "secret": "s3cr3t"}
    }
    with pytest.raises(
        SettingsError, match=r"sites.b.checkpoint_store_options.key: from_env SITE_B_KEY, which"
    ):
        site_store_options(settings, {})
    secret.unlink()
    with pytest.raises(
        SettingsError, match=r"sites.b.checkpoint_store_options.secret: from_file .*No such file"
    ):
        site_store_options(settings, {"SITE_B_KEY": "k"})


def test_each_site_is_read_from_its_own_api_and_a_launch_goes_to_its_sites_api(
    sites: TwoSites, service: SchedulerService, engine: Engine
) -> None:
    fleet = service.fleet_now()
    assert [(n.site, n.name, n.data_prefixes) for n in fleet.nodes] == [
        ("a", "gpu-a", ()),
        ("b", "gpu-b", ("s3://data-b/",)),
    ]
    assert [(s.name, s.checkpoint_store) for s in fleet.sites] == [("a", "s3://ckpt-a")]
    at_b, at_a = submit_at(engine, "b"), submit_at(engine, "a")
    attempt_b = run_at(sites.b, service, engine, at_b)
    attempt_a = run_at(sites.a, service, engine, at_a)
    for cluster, attempt_id in ((sites.a, attempt_a), (sites.b, attempt_b)):
        assert [pod["metadata"]["name"] for pod in cluster.pods()] == pods_of(cluster, attempt_id) != []
    assert set(service.launcher.alive()) == {attempt_a, attempt_b}


def test_the_mover_opens_each_sites_store_with_its_options(sites: TwoSites, engine: Engine) -> None:
    fleet = fleet_source(sites.settings)
    assert isinstance(fleet, SiteFleet)
    service = build_scheduler(sites.settings, engine, fleet, api_url=lambda: "http://api")
    try:  # b names none: the scheduler's environment's
        assert service.mover.store_options == {"a": {"endpoint_url": "http://s3.a:9000"}, "b": {}}
    finally:
        service.launcher.close()
        fleet.close()


def test_a_site_that_stops_answering_is_drained_and_stalls_no_pass_on_the_other(
    sites: TwoSites, service: SchedulerService, engine: Engine
) -> None:
    at_b = submit_at(engine, "b")
    attempt_b = run_at(sites.b, service, engine, at_b)
    sites.b_link.black_hole()

    # The pass that finds b silent waits for it no longer than b's own request timeout.
    first = timed_step(service)
    assert first < B_TIMEOUT_S + 2, first
    assert service.fleet_index().fleet.site_names == {"a"}  # b's nodes drained
    assert isinstance(service.fleet_now, SiteFleet) and service.fleet_now.down() == {"b"}

    # While b's API hangs, a job at a is placed, launched and runs: no pass waits for b.
    at_a = submit_at(engine, "a")
    passes = [timed_step(service) for _ in range(3)]
    attempt_a = run_at(sites.a, service, engine, at_a)
    assert max(passes) < B_TIMEOUT_S, passes
    assert set(service.launcher.alive()) == {attempt_a}  # b's attempt is not renewed by its launcher

    # Its lease passes: never heartbeat, it cannot be fenced, so it is held (not replaced) while b is silent.
    real = service.clock
    service.clock = lambda: real() + timedelta(seconds=LEASE_S + 1)
    assert timed_step(service) < B_TIMEOUT_S
    assert [a.state.value for a in detail(engine, at_b).attempts] == ["RUNNING"]
    assert detail(engine, at_a).job.state.value == "RUNNING"

    # b answers again: its nodes return, and the attempt whose lease lapsed is released there (LOST),
    # its job placed again at b.
    sites.b_link.heal()
    step_until(service, lambda: service.fleet_index().fleet.site_names == {"a", "b"}, "b's nodes back")
    step_until(service, lambda: len(detail(engine, at_b).attempts) == 2, "b's job placed again")
    first_attempt = detail(engine, at_b).attempts[0]
    assert (first_attempt.id, first_attempt.state.value) == (attempt_b, "LOST")
    assert pods_of(sites.b, attempt_b) == []
    step_until(service, lambda: pods_of(sites.b, detail(engine, at_b).attempts[1].id), "its pod at b")


def test_the_team_namespaces_are_rendered_for_each_sites_cluster(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuyard.cli import app

    with make_engine(sqlite_url).begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=8), utcnow())
    sites = {"a": {}, "b": {"kubernetes": {"in_cluster": False, "team_namespace_prefix": "b-team-"}}}
    monkeypatch.setenv("GPUYARD_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GPUYARD_LAUNCHER", "kubernetes")
    monkeypatch.setenv("GPUYARD_SITES", json.dumps(sites))

    def namespaces(*args: str) -> Result:
        return CliRunner().invoke(app, ["kubernetes", "namespaces", "--home", str(tmp_path), *args])

    assert "name: gpuyard-team-a\n" in namespaces("--site", "a").stdout  # the shared prefix
    assert "name: b-team-a\n" in namespaces("--site", "b").stdout
    refused = namespaces("--site", "c")
    assert refused.exit_code != 0
    assert "--site: no such site in the `sites` setting: c (sites: a, b)" in refused.output


def stopping(cluster: Cluster, attempt_id: str) -> bool:
    """Every pod of the attempt deleted (terminating: the launcher's finalizer holds it for its exit)."""
    pods = [pod for pod in cluster.pods() if pod["metadata"]["name"] in pods_of(cluster, attempt_id)]
    return bool(pods) and all(pod["metadata"].get("deletionTimestamp") for pod in pods)


def test_a_stop_at_a_silent_site_waits_for_it_and_holds_up_no_other(
    sites: TwoSites, service: SchedulerService, engine: Engine
) -> None:
    at_a, at_b = submit_at(engine, "a"), submit_at(engine, "b")
    attempt_a, attempt_b = run_at(sites.a, service, engine, at_a), run_at(sites.b, service, engine, at_b)
    sites.b_link.black_hole()
    service.step()  # finds b silent (within its request timeout)
    for job_id in (at_b, at_a):  # b's stop cannot be delivered: it fails neither the pass nor a's
        job_store.cancel(engine, job_id, at=utcnow(), by="t")
    assert timed_step(service) < B_TIMEOUT_S
    assert stopping(sites.a, attempt_a)  # a's stop delivered
    assert not stopping(sites.b, attempt_b)
    sites.b_link.heal()
    step_until(service, lambda: stopping(sites.b, attempt_b), "b's stop delivered once it answers", 30)
