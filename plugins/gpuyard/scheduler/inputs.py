"""The scheduling cycle's inputs, read from the store: the schedulable jobs and the cluster as the
leases and live attempts say it. One reading for the service's pass and for the queue's reasons
(`waiting.py`), so both see the same thing.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from gpuyard.domain.model import Attempt, Job
from gpuyard.domain.placement import Placement
from gpuyard.domain.sites import Held
from gpuyard.scheduler import sizing
from gpuyard.scheduler.snapshot import ClusterState, Elastic, FleetIndex, PendingJob, RunningAttempt
from gpuyard.store import attempts as attempt_store
from gpuyard.store import teams as team_store
from gpuyard.store.specs import SpecCache


def read(
    conn: Connection, index: FleetIndex, now: datetime, specs: SpecCache | None = None
) -> tuple[list[Job], list[PendingJob], ClusterState]:
    """The jobs a pass may place, each as the cycle reads it, and the cluster of `index`'s fleet:
    free GPUs, running attempts, each team's use (the jobs' specs from the reader's cache `specs`).
    Elastic jobs, pending and running, carry their sizes (`sizing.elastic`)."""
    waiting = attempt_store.pending_jobs(conn, now, specs)
    live = attempt_store.live(conn, specs)
    held = attempt_store.leased_gpus(conn)
    state = ClusterState.empty(index, team_store.list_teams(conn))
    holding = {item.job.id: item.attempt.placement for item in live}
    elastic_jobs = [job for job in (*waiting, *(item.job for item in live)) if job.spec.resources.elastic]
    measures = attempt_store.measured(conn, {sizing.family(job) for job in elastic_jobs})
    sizes: dict[str, Elastic] = {}
    for job in elastic_jobs:
        gpus = sum(len(n["gpus"]) for n in holding[job.id]["nodes"]) if job.id in holding else 0
        found = sizing.elastic(job, measures.get(sizing.family(job), []), now, gpus)
        if found is not None:
            sizes[job.id] = found
    for node, gpus in held.items():
        if node in state.free:
            state.free[node] -= gpus
    for item in live:
        running = running_attempt(item.attempt, item.job, now, sizes.get(item.job.id))
        state.running.append(running)
        state.use_host(running.placement, running.cpu, running.memory_gb)
        state.usage[item.job.team] = state.usage.get(item.job.team, 0) + running.gpus
        if running.borrowed:
            state.borrowed[item.job.team] = state.borrowed.get(item.job.team, 0) + running.gpus
    return waiting, [pending_job(job, sizes.get(job.id)) for job in waiting], state


def pending_job(job: Job, elastic: Elastic | None = None) -> PendingJob:
    """The cycle's view of a queued job, waiting since its submission (the service's pass moves that
    on for a move given up). An elastic job (`resources.gpus: {min, max}`, with its `elastic` sizes)
    waits for its `min`: the size it is sure to be able to run at; the cycle's sizing rule may place
    it larger."""
    spec = job.spec
    return PendingJob(
        id=job.id,
        team=job.team,
        gpus=spec.resources.gpus,
        nodes=spec.resources.nodes,
        gpu_types=spec.resources.gpu_types,
        priority=spec.priority_value,
        preemptible=spec.preemptible,
        submitted_at=job.created_at,
        gpu_memory_gb=(spec.resources.gpu_memory_bytes or 0) / 2**30,
        cpu=spec.resources.cpu_cores,
        memory_gb=spec.resources.memory_gib,
        sites=spec.sites,
        tolerations=spec.tolerations,
        data_uris=tuple(d.uri for d in spec.data),
        checkpoint_site=job.checkpoint_site,
        checkpoint_bytes=job.checkpoint_bytes or 0,
        attained_gpu_s=job.attained_gpu_s,
        # What it reads where its spec says (outputs are written at the end, not staged before).
        data=tuple(Held(d.size_bytes or 0, d.sites) for d in spec.data if d.access == "read" and d.sites),
        elastic=elastic,
    )


def running_attempt(
    attempt: Attempt, job: Job, now: datetime, elastic: Elastic | None = None
) -> RunningAttempt:
    started = attempt.started_at or attempt.created_at
    return RunningAttempt(
        attempt_id=attempt.id,
        job_id=job.id,
        team=job.team,
        priority=job.spec.priority_value,
        preemptible=job.spec.preemptible,
        placement=Placement.from_json(attempt.placement),
        started_at=started,
        last_checkpoint_at=attempt.checkpoint_at,
        borrowed=attempt.borrowed,
        cpu=job.spec.resources.cpu_cores,
        memory_gb=job.spec.resources.memory_gib,
        attained_gpu_s=job.attained_gpu_s
        + max(0.0, (now - started).total_seconds())
        * len([g for n in attempt.placement["nodes"] for g in n["gpus"]]),
        stopping=attempt.stop_requested is not None,
        submitted_at=job.created_at,
        elastic=elastic,
    )
