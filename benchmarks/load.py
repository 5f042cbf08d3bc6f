"""Load and soak: a 10,000-job burst, then a sustained rate, through HTTP, against PostgreSQL and Redis.

Processes, on loopback only: `gpuyard api` (2 workers), `gpuyard relay`, and the real scheduler
service with a launcher whose workers end at once (FastLauncher below, the only double: no process
is started per job), on a fleet of --nodes x 8 GPUs. Phases:

1. warm-up: --warmup jobs, placed and ended (caches, pools and imports settle; not counted);
2. burst: --burst jobs as fast as --connections concurrent clients submit them; then every job of
   the backlog is placed and ends;
3. sustained: --rate jobs per second for --seconds; then every job ends;
4. a second burst of --burst jobs, placed and ended (with --second-burst, the default).

Reports submit latency p50/p99 and errors per phase, submit-to-placed delay p50/p99 (job created ->
its first attempt reserved, both from the store) of the sustained phase, the burst's drain time, and
each process's RSS growth from after the warm-up to the end of phase 3, per 10,000 jobs
(`rss_mb_per_10k`), and across the second burst (`rss_mb_second_10k`): memory kept per job grows
again in a second burst; memory a backlog of that size costs once (the allocator's arenas, a pass
over 10,000 pending jobs) does not.

    .venv/bin/python benchmarks/load.py [--burst 10000] [--rate 5] [--seconds 60]

Last line: RESULT burst_errors=E sched_delay_p99_s=D burst_placed_s=P rss_mb_per_10k=M
rss_mb_second_10k=S (P: the burst's backlog placed, seconds after its last submit; M and S: the
largest of the processes). Goals: E = 0 (and no error in the sustained phase), D < 2, M < 20.
`PYTHONMALLOC=pymalloc` runs the scheduler on Python's own allocator instead of the C one that
`gpuyard scheduler` chooses (gpuyard/memory.py): the two side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import yaml
from gpuyard.clock import utcnow
from gpuyard.domain.accounting import percentile
from gpuyard.launchers.base import LaunchRequest, Outcome, WorkerReport
from gpuyard.scheduler.service import RELEASE_MEMORY_EVERY_S
from harness import free_port, log, recreate_database, servers_parser, wait_ready

SPEC = {
    "name": "load",
    "team": "bench",
    "image": "python:3.11-slim@sha256:" + "0" * 64,  # production admits images pinned by digest only
    "command": ["python", "-c", "pass"],
    "resources": {"gpus": 1, "gpu_types": ["h100"]},
    "retry": {"max_failures": 0},
}


# -- the scheduler process ------------------------------------------------------------------------


@dataclass
class FastLauncher:
    """Workers that end at once: a launch is RUNNING at the next observe, SUCCEEDED once that is stored."""

    reports: dict[str, WorkerReport] = field(default_factory=dict)  # attempt id -> unacknowledged
    tokens: dict[str, int] = field(default_factory=dict)  # attempts "running", with their token
    lock: threading.Lock = field(default_factory=threading.Lock)

    def launch(self, request: LaunchRequest) -> None:
        with self.lock:
            if request.attempt_id not in self.tokens:
                self.tokens[request.attempt_id] = request.fencing_token
                self.reports[request.attempt_id] = WorkerReport(request.attempt_id, Outcome.RUNNING, utcnow())

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        with self.lock:
            if attempt_id in self.tokens:
                self.reports[attempt_id] = WorkerReport(
                    attempt_id, Outcome.PREEMPTED, utcnow(), 75, "stopped"
                )

    def observe(self) -> list[WorkerReport]:
        with self.lock:
            return list(self.reports.values())

    def acknowledge(self, report: WorkerReport) -> None:
        with self.lock:
            if report.outcome == Outcome.RUNNING:
                self.reports[report.attempt_id] = WorkerReport(
                    report.attempt_id, Outcome.SUCCEEDED, utcnow(), 0, "all workers exited 0"
                )
            else:
                self.reports.pop(report.attempt_id, None)
                self.tokens.pop(report.attempt_id, None)

    def alive(self) -> Mapping[str, int]:
        with self.lock:
            return dict(self.tokens)

    def starting(self) -> dict[str, int]:
        return {}  # its workers start at once

    def release(self, attempt_id: str) -> bool:
        with self.lock:
            self.tokens.pop(attempt_id, None)
            self.reports.pop(attempt_id, None)
        return True

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        return []  # a fresh store: nothing ran before

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        return iter(())


def run_scheduler() -> int:
    """`load.py scheduler`: the scheduler service of the settings in the environment, with FastLauncher,
    on the allocator `gpuyard scheduler` runs on (PYTHONMALLOC=pymalloc measures Python's own)."""
    from gpuyard.memory import run_on_c_allocator

    run_on_c_allocator()
    from gpuyard.bus.factory import make_bus
    from gpuyard.scheduler.service import SchedulerService
    from gpuyard.services import build_fleet
    from gpuyard.settings import load_settings
    from gpuyard.store.db import open_store

    settings = load_settings()
    service = SchedulerService(
        open_store(settings),
        FastLauncher(),
        build_fleet(settings),
        api_url=lambda: "http://127.0.0.1:9",
        lease_ttl_s=settings.lease_seconds,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    service.run(stop, bus=make_bus(settings))
    return 0


# -- the load -------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)

    def summary(self) -> str:
        p50, p99 = percentile(self.latencies_s, 50), percentile(self.latencies_s, 99)
        return (
            f"{self.name}: {len(self.job_ids)} jobs, submit p50 {1000 * (p50 or 0):.1f} ms, "
            f"p99 {1000 * (p99 or 0):.1f} ms, errors {len(self.errors)}"
            + (f" (first: {self.errors[0]})" if self.errors else "")
        )


async def submit(client: httpx.AsyncClient, phase: Phase) -> None:
    started = time.perf_counter()
    try:
        response = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": uuid.uuid4().hex})
    except httpx.HTTPError as error:
        phase.errors.append(f"{type(error).__name__}: {error}")
        return
    phase.latencies_s.append(time.perf_counter() - started)
    if response.status_code != 201:
        phase.errors.append(f"{response.status_code} {response.text[:200]}")
    else:
        phase.job_ids.append(response.json()["id"])


async def burst(client: httpx.AsyncClient, phase: Phase, count: int, connections: int) -> None:
    queue: asyncio.Queue[None] = asyncio.Queue()
    for _ in range(count):
        queue.put_nowait(None)

    async def worker() -> None:
        while not queue.empty():
            queue.get_nowait()
            await submit(client, phase)

    await asyncio.gather(*(worker() for _ in range(connections)))


async def sustained(client: httpx.AsyncClient, phase: Phase, rate: float, seconds: float) -> None:
    start, tasks, i = time.perf_counter(), [], 0
    while (due := i / rate) < seconds:
        await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
        tasks.append(asyncio.create_task(submit(client, phase)))
        i += 1
    await asyncio.gather(*tasks)


def load(
    base: str, token: str, run: Callable[[httpx.AsyncClient], Awaitable[None]], connections: int
) -> None:
    async def main() -> None:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30, limits=limits
        ) as client:
            await run(client)

    asyncio.run(main())


def left(url: str, condition: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM jobs WHERE {condition}").fetchone()
    return int(row[0]) if row else 0


def wait_for(url: str, what: str, condition: str, timeout_s: float) -> float:
    """Seconds until no job matches `condition` (SQL over `jobs`)."""
    started = time.monotonic()
    while (count := left(url, condition)) > 0:
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"{what}: {count} jobs still {condition} after {timeout_s:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - started


UNPLACED = "attempt_count = 0"
UNFINISHED = "state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"


def placement_delays(url: str, job_ids: list[str]) -> list[float]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT EXTRACT(EPOCH FROM MIN(a.created_at) - j.created_at) FROM jobs j "
            "JOIN attempts a ON a.job_id = j.id WHERE j.id = ANY(%s) GROUP BY j.id, j.created_at",
            (job_ids,),
        ).fetchall()
    return [float(r[0]) for r in rows]


# -- processes ------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def measured(processes: dict[str, subprocess.Popen[bytes]]) -> dict[str, int]:
    """name -> pid of every process whose memory is measured (uvicorn's children, not its supervisor)."""
    pids = {name: p.pid for name, p in processes.items() if name != "api"}
    for i, pid in enumerate(sorted(children(processes["api"].pid))):
        pids[f"api child {i + 1}"] = pid
    return pids


def main() -> int:
    if sys.argv[1:] == ["scheduler"]:
        return run_scheduler()
    parser = servers_parser(__doc__)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=5.0, help="jobs per second in the sustained phase")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the sustained phase")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--nodes", type=int, default=64, help="fleet: this many nodes of 8 H100")
    parser.add_argument("--database", default="gpuyard_load", help="recreated empty on --postgres")
    parser.add_argument(
        "--second-burst", action=argparse.BooleanOptionalAction, default=True, help="phase 4 [on]"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gpuyard-load-"))
    url = recreate_database(args.postgres, args.database)
    fleet = workdir / "fleet.yaml"
    nodes = [
        {
            "name": f"n{i:03d}",
            "site": "s",
            "cluster": "c",
            "domain": f"d{i // 4}",
            "gpu_type": "h100",
            "gpus": 8,
            "gpu_memory_gb": 80,
        }
        for i in range(args.nodes)
    ]
    fleet.write_text(yaml.safe_dump({"nodes": nodes}))
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")},
        "GPUYARD_PROFILE": "production",
        "GPUYARD_LOG_LEVEL": "WARNING",  # the servers' INFO lines would bury the figures
        "GPUYARD_LAUNCHER": "local",  # unused by the API and relay; the scheduler runs FastLauncher
        "GPUYARD_DATABASE_URL": url,
        "GPUYARD_REDIS_URL": args.redis,
        "GPUYARD_REDIS_STREAM": f"gpuyard:load:{uuid.uuid4().hex[:8]}",
        "GPUYARD_HOME": str(workdir / "home"),
        "GPUYARD_FLEET_FILE": str(fleet),
        "GPUYARD_API_URL": f"http://127.0.0.1:{port}",
        "GPUYARD_DB_POOL_SIZE": "8",
        "GPUYARD_DEFAULT_QUOTA__GPU_QUOTA": "1000000",
        "GPUYARD_DEFAULT_QUOTA__MAX_GPUS_PER_JOB": "8",
    }
    cli = [sys.executable, "-m", "gpuyard.cli"]
    subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)  # production: once, first
    token = subprocess.run(
        [*cli, "token", "create", "--team", "bench"], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    processes = {
        "api": subprocess.Popen(
            [*cli, "api", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
            env=env,
            start_new_session=True,
        ),
        "relay": subprocess.Popen(
            [*cli, "relay"], env=env, start_new_session=True, stderr=subprocess.DEVNULL
        ),
        "scheduler": subprocess.Popen(
            [sys.executable, __file__, "scheduler"],
            env=env,
            start_new_session=True,
            stderr=subprocess.DEVNULL,
        ),
    }
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base)
        pids = measured(processes)

        warmup = Phase("warm-up")
        log(f"[1/4] warm-up: {args.warmup} jobs")
        load(base, token, lambda c: burst(c, warmup, args.warmup, args.connections), args.connections)
        wait_for(url, "warm-up", UNFINISHED, 300)
        before = {name: rss_mb(pid) for name, pid in pids.items()}

        spike = Phase("burst")
        log(f"[2/4] burst: {args.burst} jobs, {args.connections} connections")
        started = time.monotonic()
        load(base, token, lambda c: burst(c, spike, args.burst, args.connections), args.connections)
        submit_s = time.monotonic() - started
        placed_s = wait_for(url, "burst", UNPLACED, 1800)
        ended_s = placed_s + wait_for(url, "burst", UNFINISHED, 600)  # the sustained phase starts quiet
        drained = {name: rss_mb(pid) for name, pid in pids.items()}
        log(
            f"      {spike.summary()}; {len(spike.job_ids) / submit_s:.0f} submits/s; the backlog was placed "
            f"{placed_s:.0f}s and ended {ended_s:.0f}s after the last submit"
        )

        steady = Phase("sustained")
        log(f"[3/4] sustained: {args.rate:g} jobs/s for {args.seconds:g}s")
        load(base, token, lambda c: sustained(c, steady, args.rate, args.seconds), args.connections)
        wait_for(url, "sustained", UNFINISHED, 300)
        after = {name: rss_mb(pid) for name, pid in pids.items()}
        delays = placement_delays(url, steady.job_ids)
        log(f"      {steady.summary()}")
        again, second = after, Phase("second burst")
        if args.second_burst:
            log(f"[4/4] second burst: {args.burst} jobs")
            load(base, token, lambda c: burst(c, second, args.burst, args.connections), args.connections)
            wait_for(url, "second burst", UNFINISHED, 1800)
            # What a process keeps, not what the burst's last passes still hold: as after phase 3, it
            # is measured once the scheduler's periodic release has come round.
            log(f"      (quiet for {RELEASE_MEMORY_EVERY_S + 5:g}s, the scheduler's memory release)")
            time.sleep(RELEASE_MEMORY_EVERY_S + 5)
            again = {name: rss_mb(pid) for name, pid in pids.items()}
            log(f"      {second.summary()}")
    finally:
        for process in processes.values():
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)

    counted = len(spike.job_ids) + len(steady.job_ids)
    growth = {name: (after[name] - before[name]) / max(1, counted) * 10_000 for name in pids}
    second_growth = {name: (again[name] - after[name]) / max(1, args.burst) * 10_000 for name in pids}
    for name in pids:
        log(
            f"      RSS {name}: {before[name]:.0f} -> {drained[name]:.0f} (burst ended) "
            f"-> {after[name]:.0f} MB ({growth[name]:+.1f} MB per 10,000 jobs) -> {again[name]:.0f} MB "
            f"after the second burst ({second_growth[name]:+.1f} MB per 10,000)"
        )
    p50, p99 = percentile(delays, 50) or 0.0, percentile(delays, 99) or 0.0
    log(
        f"      submit-to-placed at {args.rate:g} jobs/s: p50 {p50:.3f}s, p99 {p99:.3f}s ({len(delays)} jobs)"
    )
    print(
        f"RESULT burst_errors={len(spike.errors)} sustained_errors={len(steady.errors)} "
        f"sched_delay_p50_s={p50:.3f} sched_delay_p99_s={p99:.3f} burst_placed_s={placed_s:.0f} "
        f"rss_mb_per_10k={max(growth.values()):.1f}"
        + (
            f" second_burst_errors={len(second.errors)} rss_mb_second_10k={max(second_growth.values()):.1f}"
            if args.second_burst
            else ""
        )
    )
    met = not spike.errors and not steady.errors and p99 < 2.0 and max(growth.values()) < 20.0
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
