"""Liveness through the Kubernetes launcher, with the real scheduler and store against the API double:
pods that run on Ready nodes keep their attempt's lease (a command that never heartbeats runs to the
end), and a node that disappears loses its attempt, which resumes elsewhere, within one lease period
and a pass."""

from __future__ import annotations

import io
import json
import sys
import time

import pytest
from conftest import LEASE_S, Cluster, clock_stopped, detail, pods_of, scheduler_on, step_until, submit
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.observability import logs
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings.kubernetes import KubernetesConfig
from sqlalchemy import Engine
from test_launcher import running, terminated, waiting

from training import exit_codes

pytestmark = pytest.mark.slow  # commands run for several lease periods


def launched(cluster: Cluster, service: SchedulerService, engine: Engine, job_id: str) -> str:
    """The job's attempt, once its pods exist."""
    step_until(service, lambda: detail(engine, job_id).attempts, "an attempt")
    attempt_id = detail(engine, job_id).attempts[-1].id
    step_until(service, lambda: pods_of(cluster, attempt_id), "its pod")
    return attempt_id


def pulling(cluster: Cluster, service: SchedulerService, engine: Engine, job_id: str) -> tuple[str, str]:
    """The job's attempt and its one pod, bound to its node and creating its container."""
    with clock_stopped(service):
        attempt_id = launched(cluster, service, engine, job_id)
        (pod,) = pods_of(cluster, attempt_id)
        cluster.bind(pod)
        cluster.set_pod_status(pod, waiting("ContainerCreating", "pulling image registry.example/train:1"))
    return attempt_id, pod


def run_pods(cluster: Cluster, service: SchedulerService, engine: Engine, job_id: str) -> str:
    """The job's attempt, once its pods run (its lease cannot pass before the test's kubelet acts)."""
    with clock_stopped(service):
        attempt_id = launched(cluster, service, engine, job_id)
        for name in pods_of(cluster, attempt_id):
            cluster.set_pod_status(name, running())
        step_until(service, lambda: detail(engine, job_id).job.state.value == "RUNNING", "running")
    return attempt_id


def test_a_plain_command_runs_three_lease_periods_in_one_attempt(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    job_id = submit(engine, ["sh", "-c", "sleep 6"])  # never heartbeats
    attempt_id = run_pods(cluster, service, engine, job_id)
    ends = time.monotonic() + 3 * LEASE_S
    while time.monotonic() < ends:  # real time must pass for a lease to: a pass every 0.1 s meanwhile
        service.step()
        assert [a.state.value for a in detail(engine, job_id).attempts] == ["RUNNING"]
        time.sleep(0.1)
    for name in pods_of(cluster, attempt_id):
        cluster.set_pod_status(name, terminated(exit_codes.SUCCESS))
    step_until(service, lambda: detail(engine, job_id).job.state.value == "SUCCEEDED", "success")
    assert [a.state.value for a in detail(engine, job_id).attempts] == ["SUCCEEDED"]


def test_a_node_that_disappears_loses_its_attempt_which_resumes_on_another(
    cluster: Cluster, config: KubernetesConfig, service: SchedulerService, engine: Engine
) -> None:
    job_id = submit(engine, ["sh", "-c", "sleep 600"])
    attempt_id = run_pods(cluster, service, engine, job_id)
    (pod,) = [p for p in cluster.pods() if p["metadata"]["name"] in pods_of(cluster, attempt_id)]
    node = pod["metadata"]["annotations"][m.NODE_ANNOTATION]
    gone = time.monotonic()
    cluster.api.delete_node(node)
    step_until(service, lambda: len(detail(engine, job_id).attempts) == 2, "the next attempt", LEASE_S + 5)
    first = detail(engine, job_id).attempts[0]
    assert (
        first.state.value == "LOST"
        and node in (first.reason or "")
        and detail(engine, job_id).job.failures == 0
    )
    assert time.monotonic() - gone < LEASE_S + 1.0  # one lease period and a pass, at most
    second = detail(engine, job_id).attempts[1]
    step_until(service, lambda: pods_of(cluster, second.id), "its pod")
    (moved,) = [p for p in cluster.pods() if p["metadata"]["name"] in pods_of(cluster, second.id)]
    assert moved["metadata"]["annotations"][m.NODE_ANNOTATION] != node and moved["metadata"][
        "namespace"
    ] == m.team_namespace("a", config)


def test_scheduler_lines_about_an_attempt_carry_its_job_and_attempt_ids(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    """In production's JSON format: the placement's line and the ending's, as fields a log collector
    indexes (bound around the attempt's work, not formatted into each message)."""
    stream = io.StringIO()
    logs.configure("INFO", "json", stream=stream)
    try:
        job_id = submit(engine, ["train"])
        attempt_id = run_pods(cluster, service, engine, job_id)
        for name in pods_of(cluster, attempt_id):
            cluster.set_pod_status(name, terminated(exit_codes.SUCCESS))
        step_until(service, lambda: detail(engine, job_id).job.state.value == "SUCCEEDED", "the ending")
        service.step()  # a pass with nothing to do for the attempt: its lines carry no stale fields
    finally:
        logs.configure("WARNING", "text", stream=sys.stderr)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    ours = [r for r in records if r["logger"] == "gpuyard.scheduler.service"]
    (placed,) = [r for r in ours if r["msg"].startswith(f"launching attempt 1 of job {job_id} on gpu-")]
    (ended,) = [r for r in ours if r["msg"].startswith(f"attempt {attempt_id} ended SUCCEEDED")]
    for record in (placed, ended):
        assert (record["job_id"], record["attempt_id"]) == (job_id, attempt_id), record
    assert (ended["outcome"], ended["exit_code"]) == ("SUCCEEDED", 0)
    for record in records:  # no line outside an attempt's work carries one
        if "attempt_id" in record:
            assert attempt_id in record["msg"] or job_id in record["msg"], record


def test_a_pod_that_takes_several_lease_periods_to_start_is_one_attempt(
    cluster: Cluster, service: SchedulerService, engine: Engine
) -> None:
    """A large image pull: the pod is bound to its node and its container is being created for
    three lease periods. Starting with progress is alive: the attempt stays LAUNCHING, is never
    lost, and runs once the pull is done."""
    job_id = submit(engine, ["sh", "-c", "sleep 600"])
    attempt_id, pod = pulling(cluster, service, engine, job_id)
    ends = time.monotonic() + 3 * LEASE_S
    while time.monotonic() < ends:  # real time must pass for a lease to
        service.step()
        assert [(a.id, a.state.value) for a in detail(engine, job_id).attempts] == [(attempt_id, "LAUNCHING")]
        time.sleep(0.1)
    cluster.set_pod_status(pod, running())
    step_until(service, lambda: detail(engine, job_id).job.state.value == "RUNNING", "running")
    assert [a.id for a in detail(engine, job_id).attempts] == [attempt_id]


def test_a_start_past_its_deadline_fails_the_attempt_with_the_reason(
    cluster: Cluster, config: KubernetesConfig, engine: Engine, team_fleet: None
) -> None:
    with scheduler_on(cluster, config.model_copy(update={"start_timeout_s": 1.5 * LEASE_S}), engine) as slow:
        job_id = submit(engine, ["sh", "-c", "sleep 600"])
        pulling(cluster, slow, engine, job_id)
        step_until(
            slow, lambda: detail(engine, job_id).attempts[0].state.value == "FAILED", "the deadline", 10
        )
    (ended, *_) = detail(engine, job_id).attempts
    assert ended.reason == "did not start within start_timeout_s (3 s): ContainerCreating"
    assert detail(engine, job_id).job.failures == 1  # it counts against the job's budget
