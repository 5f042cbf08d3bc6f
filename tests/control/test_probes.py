"""Metrics and probes of the production processes, scraped over HTTP from real processes.

The review found the API's two worker processes counting apart (a scrape saw whichever worker
answered) and the scheduler and relay with no /metrics or probes at all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import JobState
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard_client import tls_context
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, production_settings, wait_until
from sqlalchemy import Engine

from .conftest import EXAMPLE_SPEC
from .test_relay import all_seqs, submit_jobs, unpublished

pytestmark = [
    pytest.mark.parametrize("database_url", ["postgres"], indirect=True),
    pytest.mark.slow,
]  # API workers and scheduler replicas as processes


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10, verify=tls_context()).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(url: str, name: str, **labels: str) -> float | None:
    return samples(url).get((name, tuple(sorted(labels.items()))))


def answering(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Wait until `url` answers 200; fail at once, with its log, if the process ended."""

    def ok() -> bool:
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        return status(url) == 200

    wait_until(ok, timeout_s=90, what=f"{url} (log: {log})")


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5, verify=tls_context()).status_code
    except httpx.HTTPError:
        return None


@pytest.fixture
def production(database_url: str, redis_url: str, redis_stream: str, tmp_path: Path) -> dict[str, str]:
    fleet = tmp_path / "fleet.yaml"
    node = {"name": "n1", "site": "s", "cluster": "c", "domain": "d", "gpu_type": "cpu", "gpus": 2}
    fleet.write_text(yaml.safe_dump({"nodes": [node]}))
    return {
        **os.environ,
        **production_settings(database_url, redis_url, redis_stream, tmp_path / "home"),
        "GPUYARD_LAUNCHER": "local",
        "GPUYARD_FLEET_FILE": str(fleet),
        "GPUYARD_API_URL": "http://127.0.0.1:9",  # the workers here send no heartbeats
        "GPUYARD_PROBE_HOST": "127.0.0.1",
    }


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def gpuyard(processes: list[subprocess.Popen[bytes]], env: dict[str, str], log: Path, *args: str) -> Any:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", *args], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    processes.append(process)
    return process


def test_the_api_workers_share_their_counters_and_start_from_zero(
    engine: Engine, production: dict[str, str], processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "api.log"
    api = gpuyard(processes, production, log, "api", "--host", "127.0.0.1", "--port", str(port))
    answering(api, f"{url}/readyz", log)

    def probe(_: int) -> int:
        with httpx.Client() as client:  # a connection each: the kernel hands them to either worker
            return client.get(f"{url}/healthz").status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(probe, range(200))) == {200}
    healthz = {"method": "GET", "route": "/healthz", "status": "200"}
    # Whichever worker answers the scrape, it reports both workers' requests.
    assert [value(url, "gpuyard_http_requests_total", **healthz) for _ in range(6)] == [200.0] * 6
    files = list((tmp_path / "home" / "metrics").glob("counter_*.db"))
    assert len(files) == 2, files  # both workers counted some of them

    api.send_signal(signal.SIGTERM)
    assert api.wait(timeout=30) == 0
    restarted = gpuyard(processes, production, log, "api", "--host", "127.0.0.1", "--port", str(port))
    answering(restarted, f"{url}/readyz", log)
    assert probe(0) == 200
    assert value(url, "gpuyard_http_requests_total", **healthz) == 1.0  # the old run's files were cleared


def test_the_relay_serves_its_figures_and_probes(
    engine: Engine, production: dict[str, str], processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    submit_jobs(engine, 5)
    events = len(all_seqs(engine))
    log = tmp_path / "relay.log"
    relay = gpuyard(processes, {**production, "GPUYARD_RELAY_PROBE_PORT": str(port)}, log, "relay")
    answering(relay, f"{url}/healthz", log)
    wait_until(lambda: unpublished(engine) == 0, timeout_s=90, what="the relay to publish")
    assert (status(f"{url}/healthz"), status(f"{url}/readyz"), status(f"{url}/nothing")) == (200, 200, 404)
    wait_until(lambda: value(url, "gpuyard_outbox_events_published_total") == events, what="the count")
    assert value(url, "gpuyard_outbox_backlog") == 0
    assert (value(url, "gpuyard_relay_batches_total") or 0) >= 1
    assert value(url, "gpuyard_relay_lag_seconds") is not None
    assert value(url, "gpuyard_relay_failures_total") == 0


def test_two_schedulers_serve_their_figures_and_one_leads(
    engine: Engine, production: dict[str, str], processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for n, (port, url) in enumerate(zip(ports, urls, strict=True)):
        env = {**production, "GPUYARD_SCHEDULER_PROBE_PORT": str(port)}
        log = tmp_path / f"scheduler-{n}.log"
        answering(gpuyard(processes, env, log, "scheduler"), f"{url}/healthz", log)
        assert status(f"{url}/readyz") == 200
    leaders = wait_until(
        lambda: (found := [value(u, "gpuyard_scheduler_leader") for u in urls]) and sum(found) == 1 and found,
        timeout_s=60,
        what="one leader",
    )
    leader = urls[leaders.index(1.0)]

    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", TeamQuota(gpu_quota=8), utcnow())
    spec = parse_spec({**EXAMPLE_SPEC, "image": "local", "command": [sys.executable, "-c", "pass"]})
    job, _ = job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=utcnow())
    wait_until(
        lambda: job_store.detail(engine, job.id).job.state == JobState.SUCCEEDED,  # type: ignore[union-attr]
        timeout_s=90,
        what=f"the job to succeed (logs: {tmp_path})",
    )
    wait_until(
        lambda: value(leader, "gpuyard_scheduler_reports_applied_total", outcome="SUCCEEDED") == 1,
        what="the report counted",
    )
    assert value(leader, "gpuyard_scheduler_placements_total") == 1
    assert (value(leader, "gpuyard_scheduler_pass_seconds_count") or 0) >= 1
    assert value(leader, "gpuyard_scheduler_pass_failures_total") == 0
    # A job bigger than any node waits, counted by its reason.
    big = parse_spec(
        {**EXAMPLE_SPEC, "name": "big", "image": "local", "resources": {"gpus": 4, "gpu_types": ["cpu"]}}
    )
    job_store.submit(engine, big, idempotency_key=None, created_by="t", at=utcnow())
    wait_until(
        lambda: value(leader, "gpuyard_scheduler_waiting_jobs", reason="no-room") == 1, what="the job waiting"
    )
    assert value(leader, "gpuyard_scheduler_waiting_jobs", reason="quota") == 0
    standby = urls[1 - urls.index(leader)]
    assert value(standby, "gpuyard_scheduler_placements_total") == 0
    assert (value(standby, "gpuyard_scheduler_pass_seconds_count") or 0) == 0


def test_a_relay_whose_probe_port_is_taken_runs_without_probes_and_says_so(
    engine: Engine, production: dict[str, str], processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Replicas on one host (never pods: each has its own network) cannot share the default port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        submit_jobs(engine, 2)
        log = tmp_path / "relay.log"
        gpuyard(processes, {**production, "GPUYARD_RELAY_PROBE_PORT": str(port)}, log, "relay")
        wait_until(lambda: unpublished(engine) == 0, timeout_s=90, what=f"the relay to publish (log: {log})")
    assert f"relay_probe_port: cannot listen on 127.0.0.1:{port}" in log.read_text()
