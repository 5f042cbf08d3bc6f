"""Failover on Kubernetes, with the real scheduler and store against the API double: a replica that
reserved an attempt and stopped before (or in the middle of) its launch leaves it CREATED, and the
next leader's recovery completes that same attempt's launch, never taking it for lost and never
scheduling the job a second time."""

from __future__ import annotations

from conftest import Cluster, detail, pods_of, step_until, submit
from gpuyard.launchers.kubernetes.launcher import KubernetesLauncher
from gpuyard.scheduler.cycle import run_cycle
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings.kubernetes import KubernetesConfig
from gpuyard.store import attempts as attempt_store
from gpuyard.store.reservations import Reservation, reserve_batch
from sqlalchemy import Engine
from test_launcher import running


def reserve_without_launching(service: SchedulerService, engine: Engine, job_id: str) -> str:
    """What a leader that stopped right after its reservation committed leaves: a CREATED attempt."""
    now = service.clock()
    pending, snapshot, _ = service.snapshot(now)
    (placed,) = run_cycle(pending, snapshot, now, service.policy).placed
    (reserved,) = reserve_batch(
        engine, [Reservation(job_id, placed.placement, False)], at=now, lease_ttl_s=service.lease_ttl_s
    )
    assert reserved is not None
    return reserved.id


def test_recovery_launches_a_reserved_attempt_once_and_never_takes_it_for_lost(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    job_id = submit(engine, ["sh", "-c", "sleep 60"])
    attempt_id = reserve_without_launching(service, engine, job_id)
    assert pods_of(cluster, attempt_id) == []

    service.recover()  # the next leader, on taking the lead

    (attempt,) = detail(engine, job_id).attempts
    assert (attempt.id, attempt.state.value) == (attempt_id, "LAUNCHING")  # not LOST
    assert len(pods_of(cluster, attempt_id)) == 1
    for name in pods_of(cluster, attempt_id):
        cluster.set_pod_status(name, running())
    step_until(service, lambda: detail(engine, job_id).job.state.value == "RUNNING", "running")
    assert [a.id for a in detail(engine, job_id).attempts] == [attempt_id]  # never scheduled again


def test_recovery_completes_a_launch_a_replica_left_half_done(
    cluster: Cluster, config: KubernetesConfig, service: SchedulerService, engine: Engine
) -> None:
    job_id = submit(engine, ["sh", "-c", "sleep 60"])
    attempt_id = reserve_without_launching(service, engine, job_id)
    # The replica created the attempt's Secret, policy and Service, and stopped before its pods and
    # before its claim committed: the claim was rolled back with its transaction (still CREATED).
    with engine.connect() as conn:
        (item,) = [i for i in attempt_store.live(conn) if i.attempt.id == attempt_id]
    with KubernetesLauncher(config, cluster.api, teams=lambda: ["a"]) as stopped:
        stopped.launch(service.launch_request(item.attempt, item.job))
    for name in pods_of(cluster, attempt_id):  # never created: gone, finalizers and all
        cluster.emulator.delete_silently("pods", name, force=True)
    (secret,) = cluster.objects("secrets")

    service.recover()

    (attempt,) = detail(engine, job_id).attempts
    assert (attempt.id, attempt.state.value) == (attempt_id, "LAUNCHING")  # not LOST
    assert [s["metadata"]["uid"] for s in cluster.objects("secrets")] == [secret["metadata"]["uid"]]
    (pod,) = pods_of(cluster, attempt_id)  # the rest of the same attempt, added
    cluster.set_pod_status(pod, running())
    step_until(service, lambda: detail(engine, job_id).job.state.value == "RUNNING", "running")
    assert [a.id for a in detail(engine, job_id).attempts] == [attempt_id]
