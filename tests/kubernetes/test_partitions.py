"""A partitioned node is not a dead one (docs/faults.md, "Partitions").

(a) The node stops reporting (NotReady) while its pods still reach the control plane: their workers'
    heartbeats keep the lease, so the attempt runs on and nothing is launched beside it. Guarantee:
    at most one attempt *runs*.
(b) The node and its pods are cut from everything: no heartbeat renews the lease. A worker that
    heartbeats (the training runtime) fences itself: it writes no checkpoint once its lease lapsed.
    So its attempt is lost at the lease's expiry and the job runs again elsewhere, while the old pods
    may still run (a real cluster keeps them Terminating until their kubelet returns). Guarantee: at
    most one attempt *commits*: the old attempt's fencing token is stale from the moment it is lost,
    so when the partition heals its heartbeats, checkpoints and exit are refused or ignored, and its
    checkpoint folders (named by its token, `training/checkpoint.py`) are never the job's. A worker
    that never heartbeats (a plain command) cannot be fenced: its attempt is not replaced while its
    pods may run, only once they are known stopped (ended, gone, or their node removed). Guarantee:
    at most one attempt *runs*.

Leases are real time here: the tests step the real scheduler while it passes.
"""

from __future__ import annotations

import time

import pytest
from conftest import LEASE_S, Cluster, detail, pods_of, step_until, submit
from gpuyard.clock import utcnow
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.scheduler.service import SchedulerService
from gpuyard.store import attempts as attempt_store
from sqlalchemy import Engine
from test_launcher import running as pod_running
from test_launcher import terminated
from test_liveness import run_pods

from training import exit_codes

pytestmark = pytest.mark.slow  # several lease periods of real time


def node_of(cluster: Cluster, attempt_id: str) -> str:
    (pod,) = [p for p in cluster.pods() if p["metadata"]["name"] in pods_of(cluster, attempt_id)]
    return str(pod["metadata"]["annotations"][m.NODE_ANNOTATION])


def set_ready(cluster: Cluster, node: str, status: str) -> None:
    """The node controller's view of the kubelet: "Unknown" once it stops reporting."""
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "NodeStatusUnknown" if status != "True" else "KubeletReady",
    }
    cluster.api.patch_node(node, {"status": {"conditions": [condition]}})


def training(cluster: Cluster, service: SchedulerService, engine: Engine) -> tuple[str, str, int, str]:
    """A job whose first attempt's pods run: its id, the attempt's, and the fencing token and secret
    the attempt's worker has in its environment."""
    job_id = submit(engine, ["train"])
    attempt_id = run_pods(cluster, service, engine, job_id)
    attempt = detail(engine, job_id).attempts[0]
    return job_id, attempt_id, attempt.fencing_token, attempt.attempt_secret or ""


def beat(engine: Engine, attempt_id: str, token: int, secret: str, **progress: object) -> attempt_store.Beat:
    """What the attempt's worker sends (the API's heartbeat, without HTTP)."""
    return attempt_store.heartbeat(
        engine,
        attempt_id,
        token,
        secret=secret,
        step=progress.get("step"),  # type: ignore[arg-type]
        checkpoint=progress.get("checkpoint"),  # type: ignore[arg-type]
        at=utcnow(),
        lease_ttl_s=LEASE_S,
    )


def test_pods_of_a_node_that_stops_reporting_run_on_while_their_workers_heartbeat(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    job_id, attempt_id, token, secret = training(cluster, service, engine)
    set_ready(cluster, node_of(cluster, attempt_id), "Unknown")
    ends, step = time.monotonic() + 3 * LEASE_S, 0
    while time.monotonic() < ends:  # three leases: only the workers' beats renew it now
        step += 1
        beat(engine, attempt_id, token, secret, step=step)
        for _ in range(3):
            service.step()
            time.sleep(0.1)
        assert [a.state.value for a in detail(engine, job_id).attempts] == ["RUNNING"]
        assert {p["metadata"]["annotations"][m.ATTEMPT_ID_ANNOTATION] for p in cluster.pods()} == {attempt_id}
    set_ready(cluster, node_of(cluster, attempt_id), "True")
    for name in pods_of(cluster, attempt_id):
        cluster.set_pod_status(name, terminated(exit_codes.SUCCESS))
    step_until(service, lambda: detail(engine, job_id).job.state.value == "SUCCEEDED", "success")
    assert [a.state.value for a in detail(engine, job_id).attempts] == ["SUCCEEDED"]


def test_an_attempt_cut_off_with_its_node_is_replaced_and_can_commit_nothing_when_it_returns(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    job_id, first, old_token, old_secret = training(cluster, service, engine)
    beat(engine, first, old_token, old_secret, step=1)  # a worker of the training runtime: it fences itself
    node = node_of(cluster, first)
    (old_pod,) = pods_of(cluster, first)
    cluster.hold_termination(old_pod)  # its kubelet is unreachable: the pod stays Terminating
    set_ready(cluster, node, "Unknown")
    step_until(service, lambda: len(detail(engine, job_id).attempts) == 2, "the next attempt", 3 * LEASE_S)
    lost, second = detail(engine, job_id).attempts
    assert lost.state.value == "LOST" and "fenced from committing" in (lost.reason or "")
    step_until(service, lambda: pods_of(cluster, second.id), "its pod")
    assert node_of(cluster, second.id) != node and second.fencing_token > old_token
    for name in pods_of(
        cluster, second.id
    ):  # it runs: its launcher renews it (a short lease, a busy machine)
        cluster.set_pod_status(name, pod_running())
    step_until(service, lambda: detail(engine, job_id).attempts[1].state.value == "RUNNING", "it runs")
    # The partition heals: the old worker beats, records a checkpoint and exits 0. None of it counts.
    set_ready(cluster, node, "True")
    with pytest.raises(attempt_store.Unproven):  # its attempt ended, and its secret with it
        beat(engine, first, old_token, old_secret, step=99)
    with pytest.raises(attempt_store.Unproven):
        checkpoint = {
            "url": f"s3://ckpt/{job_id}/step-000000099-t{old_token}",
            "step": 99,
            "saved_at": utcnow(),
        }
        beat(engine, first, old_token, old_secret, checkpoint=checkpoint)
    cluster.set_pod_status(old_pod, terminated(exit_codes.SUCCESS))
    for _ in range(10):
        service.step()
    after = detail(engine, job_id)
    assert after.job.state.value != "SUCCEEDED" and after.job.checkpoint_url is None
    assert [a.state.value for a in after.attempts] == ["LOST", "RUNNING"]
    cluster.finish_termination(old_pod)


def test_a_plain_command_on_a_node_that_stops_reporting_is_not_run_twice(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    job_id = submit(engine, ["sh", "-c", "sleep 600"])  # never heartbeats: nothing can fence it
    attempt_id = run_pods(cluster, service, engine, job_id)
    node = node_of(cluster, attempt_id)
    (pod,) = pods_of(cluster, attempt_id)
    cluster.hold_termination(pod)  # its kubelet is unreachable: a deleted pod stays Terminating
    set_ready(cluster, node, "Unknown")
    ends = time.monotonic() + 3 * LEASE_S
    while time.monotonic() < ends:  # its lease passes: it may still run, so it is not replaced
        service.step()
        assert [a.state.value for a in detail(engine, job_id).attempts] == ["RUNNING"]
        time.sleep(0.1)
    assert {p["metadata"]["annotations"][m.ATTEMPT_ID_ANNOTATION] for p in cluster.pods()} <= {attempt_id}
    cluster.api.delete_node(node)  # the operator (or the cloud) confirms the node is gone
    step_until(
        service, lambda: len(detail(engine, job_id).attempts) == 2, "the next attempt", 120
    )  # a bound: under the full suite, beside real workers
    assert detail(engine, job_id).attempts[0].state.value == "LOST"
    cluster.finish_termination(pod)
