"""How fast the gpuyard page's reads answer with 10,000 jobs waiting, on PostgreSQL.

A throwaway database on the server of --postgres (dropped afterwards), migrated; 10 teams; a fleet of
--nodes nodes x 8 GPUs in domains of 4 (a quarter spot); --jobs PENDING jobs of 1 to 8 GPUs spread
over the teams, inserted in one transaction. The API runs under uvicorn; the page's app calls it
through the HTTP client as a platform admin. Measures (median of --repeat):
- the scheduler recording every job's reason, as a new leader's first pass does (`record_ms`: one
  cycle's reasons, nothing placed, written through scheduler/waiting.py's recorder);
- `GET /v1/queue` cold: the queue and the recorded reasons read afresh (the cache emptied before each
  call);
- `GET /v1/queue` warm, filtered by reason, and its last page (offset jobs - 50);
- `GET /v1/fleet` and `GET /v1/metrics/series` (24 h, 48 steps);
- the page itself (queue and fleet, server-rendered), end to end through the client.

    .venv/bin/python benchmarks/ui_queue.py [--jobs 10000] [--nodes 64]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import uvicorn
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet
from gpuyard.domain.spec import JobSpec
from gpuyard.scheduler import inputs
from gpuyard.scheduler.cycle import run_cycle
from gpuyard.scheduler.policy import POLICIES
from gpuyard.scheduler.snapshot import FleetIndex
from gpuyard.scheduler.waiting import WaitRecorder, reasons
from gpuyard.settings import load_settings
from gpuyard.sim.fleet_builder import standard_fleet
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine, migrate
from gpuyard.store.jobs import new_job_row
from gpuyard.store.tables import jobs as jobs_table
from gpuyard_provider.ui.app import COOKIE
from gpuyard_provider.ui.app import create_app as create_page
from sqlalchemy import Engine, insert


def median_ms(call: Callable[[], object], repeat: int, before: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(repeat):
        before()
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    name = f"gpuyard_ui_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as admin_conn:
        admin_conn.execute(f'CREATE DATABASE "{name}"')
    url = args.postgres.rsplit("/", 1)[0] + "/" + name
    try:
        run(url, args)
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin_conn:
            admin_conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def record_reasons(engine: Engine, fleet: Fleet) -> float:
    """What the scheduler's pass records for the page to read: each job's reason after one cycle (nothing
    is reserved here, so every job stays waiting). Returns the milliseconds the writing took."""
    now = datetime.now(UTC)
    with engine.connect() as conn:
        waiting, pending, state = inputs.read(conn, FleetIndex(fleet), now)
    by_id = {job.id: job for job in waiting}
    result = run_cycle(pending, state, now, POLICIES["gpuyard"])
    started = time.perf_counter()
    WaitRecorder(engine).record(reasons(result, by_id), by_id, at=now, lead=None)
    return (time.perf_counter() - started) * 1000


def run(url: str, args: argparse.Namespace) -> None:
    rng = random.Random(7)
    engine = make_engine(url, pool_size=8)
    migrate(engine)
    now = datetime.now(UTC)
    teams = [f"team{i}" for i in range(10)]
    with engine.begin() as conn:
        for team in teams:
            team_store.ensure_team(conn, team, TeamQuota(gpu_quota=48, max_gpus_per_job=8), now)
        token = team_store.create_token(conn, "team0", team_store.Role.PLATFORM_ADMIN, now)
    print(f"inserting {args.jobs:,} pending jobs ...", flush=True)
    rows = []
    for i in range(args.jobs):
        spec = JobSpec.model_validate(
            {
                "name": f"job-{i}",
                "team": rng.choice(teams),
                "image": "python:3.11-slim",
                "command": ["python", "train.py"],
                "resources": {"gpus": rng.choice((1, 1, 1, 2, 4, 8)), "gpu_types": ["V100"], "nodes": 1},
                "priority": rng.choice(("low", "normal", "normal", "high")),
            }
        )
        rows.append(
            new_job_row(
                spec, idempotency_key=None, created_by="bench", at=now - timedelta(seconds=args.jobs - i)
            )
        )
    with engine.begin() as conn:
        conn.execute(insert(jobs_table), rows)
    home = Path(tempfile.mkdtemp(prefix="gpuyard-ui-bench-"))
    settings = load_settings(home=home, database_url=url, profile="embedded")
    fleet = standard_fleet(nodes=args.nodes)
    record_ms = record_reasons(engine, fleet)
    api = create_app(settings, engine, fleet=fleet)
    context = api.state.context
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)

    def get(path: str, **params: object) -> dict:  # type: ignore[type-arg]
        response = http.get(path, params=params)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    first = get("/v1/queue")
    print(f"queue: {first['total']:,} waiting, reasons {first['reasons']}", flush=True)
    cold = median_ms(lambda: get("/v1/queue"), args.repeat, before=context.queue_view.clear)
    warm = median_ms(lambda: get("/v1/queue"), args.repeat)
    filtered = median_ms(lambda: get("/v1/queue", reason="no-room", team="team3"), args.repeat)
    last = median_ms(lambda: get("/v1/queue", offset=max(0, args.jobs - 50)), args.repeat)
    fleet_ms = median_ms(lambda: get("/v1/fleet"), args.repeat)
    series = median_ms(lambda: get("/v1/metrics/series", hours=24, steps=48), args.repeat)
    page = TestClient(create_page(lambda: base))
    page.cookies.set(COOKIE, token)

    def render() -> None:
        response = page.get("/")
        assert response.status_code == 200 and "section" in response.text, response.text[:500]

    page_ms = median_ms(render, args.repeat)
    print(
        f"RESULT jobs={args.jobs} nodes={args.nodes} record_ms={record_ms:.0f} queue_cold_ms={cold:.0f} "
        f"queue_warm_ms={warm:.0f} queue_filtered_ms={filtered:.0f} queue_last_page_ms={last:.0f} "
        f"fleet_ms={fleet_ms:.0f} "
        f"series_ms={series:.0f} page_ms={page_ms:.0f}"
    )
    http.close()
    server.should_exit = True
    thread.join(10)
    engine.dispose()


if __name__ == "__main__":
    main()
