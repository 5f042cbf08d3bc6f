"""Placement throughput of the real scheduling cycle on 5,000 nodes, alone and with PostgreSQL reserves.

Fleet: 5,000 nodes x 8 GPUs whose GPU models follow the GPU mix of alibaba_openb_gpu_nodes.csv, in
fast domains of 4 nodes of one model. Queue: 10,000 pending jobs whose GPU counts follow the Philly
trace, from its teams, a third of them asking for one GPU model. Measures
- decisions per second of `run_cycle` (policy gpuyard: quotas, 2D-LAS, starvation guard), each
  pending job placed or told why it waits, median of 3 cycles on a fresh snapshot of one fleet index
  (kept from cycle to cycle, as the service keeps it: the first cycle also runs the filters) (also
  per CPU-second of this process, with the load average: on a shared machine wall time is not CPU
  time);
- placements per second end to end: the cycle plus the reserve of its placements with
  `gpuyard.store.reservations.reserve_batch`, as `SchedulerService.schedule` does (one transaction
  per batch of --batch gangs: the attempt rows, one lease row per GPU, the jobs PENDING -> SCHEDULED
  in one statement), against a throwaway database created on the server of --postgres and dropped
  afterwards;
- peak RSS of the process.

    .venv/bin/python benchmarks/scheduler_throughput.py [--nodes 5000] [--jobs 10000] [--batch 256]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import resource
import statistics
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.spec import JobSpec
from gpuyard.scheduler.cycle import run_cycle
from gpuyard.scheduler.policy import POLICIES
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob
from gpuyard.store.reservations import BATCH, Reservation, reserve_batch
from gpuyard.store.tables import jobs as jobs_table
from gpuyard.store.tables import metadata, teams
from sqlalchemy import create_engine, insert

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MEMORY_GB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 80, "G3": 80}


def build_fleet(nodes: int, rng: random.Random) -> Fleet:
    mix: Counter[str] = Counter()
    with (TRACES / "alibaba_openb_gpu_nodes.csv").open() as handle:
        for row in csv.DictReader(handle):
            mix[row["model"]] += int(row["gpu"])
    models = sorted(mix)
    chosen = sorted(rng.choices(models, weights=[mix[m] for m in models], k=nodes))
    built, per_model = [], Counter[str]()
    for i, model in enumerate(chosen):
        k = per_model[model]
        per_model[model] += 1
        built.append(
            Node(
                name=f"n{i:05d}",
                site="bench",
                cluster="bench",
                domain=f"{model.lower()}-{k // 4:04d}",
                gpu_type=model,
                gpus=8,
                gpu_memory_gb=MEMORY_GB.get(model, 16),
                price_per_gpu_hour=1.0,
            )
        )
    return Fleet(nodes=tuple(built))


def build_queue(count: int, models: list[str], rng: random.Random) -> list[PendingJob]:
    sizes: Counter[int] = Counter()
    clusters: Counter[str] = Counter()
    with (TRACES / "philly_sep_oct_2017.csv").open() as handle:
        for row in csv.DictReader(handle):
            sizes[int(float(row["num_gpus"]))] += 1
            clusters[row["cluster"]] += 1
    size_keys, team_keys = sorted(sizes), sorted(clusters)
    t0 = datetime(2017, 10, 1, tzinfo=UTC)
    queue = []
    for i in range(count):
        gpus = rng.choices(size_keys, weights=[sizes[s] for s in size_keys])[0]
        nodes = max(1, -(-gpus // 8))
        queue.append(
            PendingJob(
                id=f"bench-{i:06d}",
                team=rng.choices(team_keys, weights=[clusters[c] for c in team_keys])[0],
                gpus=gpus,
                nodes=nodes,
                gpu_types=(rng.choice(models),) if rng.random() < 1 / 3 else (),
                priority=0,
                preemptible=True,
                submitted_at=t0 + timedelta(seconds=i),
            )
        )
    return queue


def spec_json(job: PendingJob) -> dict[str, object]:
    spec = {
        "name": "bench",
        "team": job.team,
        "image": "python:3.11-slim",
        "command": ["true"],
        "resources": {"gpus": job.gpus, "nodes": job.nodes, "gpu_types": list(job.gpu_types)},
    }
    return JobSpec.model_validate(spec).model_dump(mode="json")


def quotas_for(queue: list[PendingJob], fleet: Fleet) -> dict[str, TeamQuota]:
    demand = Counter(j.team for j in queue)
    total = sum(n.gpus for n in fleet.nodes)
    return {
        t: TeamQuota(gpu_quota=max(1, total * n // len(queue)), cohort="all", max_gpus_per_job=64)
        for t, n in demand.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=BATCH, help="gangs per reserve transaction")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    fleet = build_fleet(args.nodes, rng)
    queue = build_queue(args.jobs, sorted(fleet.gpu_types), rng)
    quotas = quotas_for(queue, fleet)
    policy = POLICIES["gpuyard"]
    index = FleetIndex(fleet)
    now = datetime(2017, 10, 2, tzinfo=UTC)
    print(
        f"fleet {len(fleet.nodes)} nodes, {sum(n.gpus for n in fleet.nodes)} GPUs, "
        f"{len(fleet.domains())} domains, models {dict(Counter(n.gpu_type for n in fleet.nodes))}"
    )
    print(
        f"queue {len(queue)} jobs, {sum(j.gpus for j in queue)} GPUs asked, sizes "
        f"{dict(sorted(Counter(j.gpus for j in queue).items()))}"
    )

    timings, cpu, result = [], [], None
    for _ in range(3):
        state = ClusterState.empty(index, quotas)
        began, began_cpu = time.perf_counter(), time.process_time()
        result = run_cycle(list(queue), state, now, policy)
        timings.append(time.perf_counter() - began)
        cpu.append(time.process_time() - began_cpu)
    assert result is not None
    decided = len(result.placed) + len(result.waiting)
    cycle_s = statistics.median(timings)
    decisions_per_s = decided / cycle_s
    print(
        f"cycle: {len(result.placed)} placed, {len(result.waiting)} waiting, "
        f"{', '.join(f'{t:.3f}' for t in timings)} s -> {decisions_per_s:,.0f} decisions/s "
        f"(CPU {', '.join(f'{t:.3f}' for t in cpu)} s: "
        f"{decided / statistics.median(cpu):,.0f} per CPU-second; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )

    # End to end: a fresh cycle, then its placements reserved in batches on a throwaway database.
    name = f"gpuyard_bench_{uuid.uuid4().hex[:8]}"
    server = args.postgres.rsplit("/", 1)[0]
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    engine = create_engine(f"{server.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}")
    try:
        metadata.create_all(engine)
        stamp = datetime.now(UTC)
        with engine.begin() as conn:
            conn.execute(
                insert(teams),
                [
                    {
                        "name": t,
                        "max_gpus_per_job": 64,
                        "allowed_gpu_types": [],
                        "gpu_quota": q.gpu_quota,
                        "cohort": "all",
                        "weight": 1.0,
                        "created_at": stamp,
                        "updated_at": stamp,
                    }
                    for t, q in quotas.items()
                ],
            )
            conn.execute(
                insert(jobs_table),
                [
                    {
                        "id": j.id,
                        "team": j.team,
                        "name": "bench",
                        "spec": spec_json(j),
                        "spec_hash": "0" * 64,
                        "state": "PENDING",
                        "priority": 0,
                        "gpus": j.gpus,
                        "created_by": "bench",
                        "created_at": stamp,
                        "updated_at": stamp,
                    }
                    for j in queue
                ],
            )
        state = ClusterState.empty(index, quotas)
        began = time.perf_counter()
        result = run_cycle(list(queue), state, now, policy)
        decided_at = time.perf_counter()
        wanted = [Reservation(p.job.id, p.placement, p.borrowed) for p in result.placed]
        made = reserve_batch(engine, wanted, at=stamp, lease_ttl_s=60.0, batch=args.batch)
        reserved = sum(attempt is not None for attempt in made)
        e2e_s = time.perf_counter() - began
        reserve_s = e2e_s - (decided_at - began)
    finally:
        engine.dispose()
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    placements_per_s = reserved / e2e_s
    print(
        f"end to end: {reserved} of {len(result.placed)} placements reserved in {e2e_s:.2f} s "
        f"(cycle {e2e_s - reserve_s:.2f} s, reserve {reserve_s:.2f} s: "
        f"{reserved / reserve_s:,.0f} reserves/s), batches of {args.batch} "
        f"-> {placements_per_s:,.0f} placements/s; load average {os.getloadavg()[0]:.1f}"
    )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"RESULT decisions_per_s={decisions_per_s:.0f} placements_per_s={placements_per_s:.0f} "
        f"peak_rss_mb={peak_mb:.0f}"
    )


if __name__ == "__main__":
    main()
