"""The production profile end to end: `gpuyard migrate`, `gpuyard api` (2 workers), `gpuyard relay` and
two `gpuyard scheduler` replicas as separate processes on PostgreSQL and Redis, with the Kubernetes
launcher talking over HTTP to the Kubernetes API double (kmock's emulator, tests/kubernetes/conftest.py).

The test plays the kubelets and the node controller through that API: pods go Pending -> Running ->
Succeeded; a gang of two meets at its headless Service's name; a node drained with eviction mid-run
(the job resumes from its checkpoint on another node, its failure budget untouched); a node going
NotReady (its attempt lost once its lease runs out, the job placed elsewhere); an image that cannot be
pulled (the job fails, naming it); the leading scheduler SIGKILLed mid-run (the other takes over and
adopts the running pods). The team's namespace is what `gpuyard kubernetes namespaces` prints, applied
as a cluster admin would; every attempt's objects live there, its pods isolated by their NetworkPolicy.
At the end: every job in its state, never two live attempts of a job, never a GPU leased to two attempts
at once, and no object the launcher made (pods, Services, Secrets, NetworkPolicies) left in the cluster.
"""

from __future__ import annotations

import base64
import itertools
import os
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import NAMESPACE, Cluster, assert_valid
from gpuyard.launchers.kubernetes import manifests as m
from local_cluster.control_plane import ControlPlane, settings
from servers import free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

IMAGE = "registry.example/train@sha256:" + "a" * 64  # production admits images pinned by digest only
LEASE_S = 10
TEAM_NS = "gpuyard-team-ml"
ATTEMPT_PLURALS = ("pods", "services", "secrets", "networkpolicies")


def pod_status(phase: str, state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    """A pod's status as its kubelet reports it: the phase, and its one container (`worker`) in `state`."""
    return {
        "phase": phase,
        "containerStatuses": [
            {
                "name": "worker",
                "image": IMAGE,
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "state": state,
            }
        ],
    }


def running() -> dict[str, Any]:
    return pod_status("Running", {"running": {"startedAt": "2026-12-01T10:00:00Z"}}, ready=True)


def exited(code: int) -> dict[str, Any]:
    state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
    return pod_status("Succeeded" if code == 0 else "Failed", state)


class Platform(ControlPlane):
    """The control plane's processes (local_cluster.control_plane), and the calls the test makes as
    users, kubelets and operators."""

    def __init__(
        self, cluster: Cluster, database_url: str, redis_url: str, run: Path, host: str = "127.0.0.1"
    ):
        """`host`: where the API listens (an emulated cluster's gateway, for its pods' heartbeats)."""
        port = free_port()
        env = settings(
            database_url=database_url,
            redis_url=redis_url,
            api_url=f"http://{host}:{port}",
            kubernetes_url=cluster.url,
            run=run,
            lease_s=LEASE_S,
            grace_s=5,
            checkpoint_store="s3://ckpt",  # team ml's root: s3://ckpt/ml
            namespace=NAMESPACE,
        )
        outside = {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "PROMETHEUS_"))}
        super().__init__(
            run,
            {**outside, **env, "GPUYARD_REDIS_STREAM": f"gpuyard:e2e:{uuid.uuid4().hex[:8]}"},
            host=host,
            port=port,
        )
        self.cluster = cluster
        self.token = ""

    def up(self) -> None:  # type: ignore[override]
        self.gpuyard("migrate")
        self.token = self.team_token("ml", "the end-to-end test")
        # the team's namespace, as a cluster admin applies it: kubectl apply -f - of what this prints
        namespaces = self.namespaces()
        for doc in namespaces:
            assert_valid(doc)
        assert {doc["metadata"].get("namespace", doc["metadata"]["name"]) for doc in namespaces} == {TEAM_NS}
        self.cluster.apply(namespaces)
        super().up()

    # -- as a user --------------------------------------------------------------------------------

    def submit(self, name: str, **overrides: Any) -> str:
        spec = {
            "name": name,
            "team": "ml",
            "image": IMAGE,
            "command": ["torchrun", "train.py"],
            "resources": {"gpus": 1, "gpu_types": ["h100"], "nodes": 1},
            "retry": {"max_failures": 0},
            "checkpoint": {"url": f"s3://ckpt/ml/{name}"},  # under team ml's root
            **overrides,
        }
        answer = httpx.post(
            f"{self.url}/v1/jobs",
            json=spec,
            headers={"Authorization": f"Bearer {self.token}", "Idempotency-Key": uuid.uuid4().hex},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {self.token}"})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def until_state(self, job_id: str, state: str, timeout_s: float = 90) -> dict[str, Any]:
        return dict(
            wait_until(
                lambda: (job := self.job(job_id))["state"] == state and job,
                timeout_s=timeout_s,
                what=f"job {job_id} {state} (logs in {self.run})",
            )
        )

    # -- as kubelets and operators ----------------------------------------------------------------

    def pods(self, job_id: str, attempt: int) -> list[dict[str, Any]]:
        return sorted(
            (
                p
                for p in self.cluster.pods()
                if p["metadata"]["annotations"].get(m.JOB_ID_ANNOTATION) == job_id
                and p["metadata"]["annotations"].get(m.ATTEMPT_NUMBER_ANNOTATION) == str(attempt)
            ),
            key=lambda p: p["metadata"]["name"],
        )

    def until_pods(self, job_id: str, attempt: int, count: int = 1) -> list[dict[str, Any]]:
        return list(
            wait_until(
                lambda: len(found := self.pods(job_id, attempt)) == count and found,
                timeout_s=90,
                what=f"{count} pod(s) of job {job_id} attempt {attempt} (logs in {self.run})",
            )
        )

    def set_status(self, pods: list[dict[str, Any]], status: dict[str, Any]) -> None:
        for pod in pods:
            self.cluster.set_pod_status(pod["metadata"]["name"], status)

    def secret_data(self, pod: dict[str, Any], name: str) -> str:
        """A value of the pod's attempt's Secret, as its worker reads it (GPUYARD_FENCING_TOKEN, ...)."""
        key = pod["metadata"]["labels"][m.ATTEMPT_LABEL]
        (secret,) = [s for s in self.cluster.objects("secrets") if s["metadata"]["name"] == key]
        return base64.b64decode(secret["data"][name]).decode()


def node_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["annotations"][m.NODE_ANNOTATION])


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture
def platform(cluster: Cluster, postgres_server: str, redis_url: str, tmp_path: Path) -> Iterator[Platform]:
    for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        cluster.add_node(name)
    database = f"gpuyard_e2e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    platform = Platform(cluster, postgres_server.rsplit("/", 1)[0] + "/" + database, redis_url, tmp_path)
    try:
        platform.up()
        yield platform
    finally:
        platform.stop()
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_the_production_profile_end_to_end(platform: Platform, cluster: Cluster) -> None:
    jobs: dict[str, str] = {}

    # A gang of two pods meets at its headless Service's name; both run, both exit 0.
    jobs["gang"] = platform.submit("gang", resources={"gpus": 2, "gpu_types": ["h100"], "nodes": 2})
    gang = platform.until_pods(jobs["gang"], 1, count=2)
    key = gang[0]["metadata"]["labels"][m.ATTEMPT_LABEL]
    (service,) = [s for s in cluster.objects("services") if s["metadata"]["name"] == key]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {m.ATTEMPT_LABEL: key}
    (policy,) = [p for p in cluster.objects("networkpolicies") if p["metadata"]["name"] == key]
    gang_only = {"podSelector": {"matchLabels": {m.ATTEMPT_LABEL: key}}}
    assert policy["spec"]["podSelector"] == gang_only["podSelector"]
    assert policy["spec"]["ingress"] == [{"from": [gang_only]}]  # the rendezvous port opens to the gang only
    assert {o["metadata"]["namespace"] for o in [*gang, service, policy]} == {TEAM_NS}
    rendezvous = f"{key}-0.{key}.{TEAM_NS}.svc.cluster.local"
    assert [env_of(p)["MASTER_ADDR"] for p in gang] == [rendezvous, rendezvous]
    assert (gang[0]["spec"]["hostname"], gang[0]["spec"]["subdomain"]) == (f"{key}-0", key)
    assert len({node_of(p) for p in gang}) == 2
    platform.set_status(gang, running())
    wait_until(lambda: platform.job(jobs["gang"])["attempts"][0]["state"] == "RUNNING", what="gang running")
    platform.set_status(gang, exited(0))
    platform.until_state(jobs["gang"], "SUCCEEDED")

    # An image that cannot be pulled: the job fails, naming the image and the reason.
    jobs["pull"] = platform.submit("pull")
    (pod,) = platform.until_pods(jobs["pull"], 1)
    pulling = {"waiting": {"reason": "ErrImagePull", "message": f"pull {IMAGE}: not found"}}
    platform.set_status([pod], pod_status("Pending", pulling))
    failed = platform.until_state(jobs["pull"], "FAILED")
    assert "image pull failed: ErrImagePull" in failed["attempts"][0]["reason"]

    # A node drained mid-run (cordoned, its pod evicted): the job resumes from its checkpoint elsewhere.
    jobs["drain"] = platform.submit("drain")
    (pod,) = platform.until_pods(jobs["drain"], 1)
    platform.set_status([pod], running())
    attempt = platform.job(jobs["drain"])["attempts"][0]
    checkpoint = "s3://ckpt/ml/drain/step-000000040"
    url = f"{platform.url}/v1/attempts/{attempt['id']}/heartbeat"
    body = {
        "fencing_token": int(platform.secret_data(pod, m.FENCING_TOKEN_KEY)),
        "step": 42,
        "checkpoint": {"url": checkpoint, "step": 40},
    }
    assert httpx.post(url, json=body).status_code == 401  # the fencing token alone proves nothing
    secret = {"Authorization": f"Bearer {platform.secret_data(pod, m.ATTEMPT_SECRET_KEY)}"}
    beat = httpx.post(url, json=body, headers=secret)
    assert beat.status_code == 200, beat.text
    drained = node_of(pod)
    cluster.api.patch_node(drained, {"spec": {"unschedulable": True}})
    platform.set_status([pod], {"phase": "Failed", "reason": "Evicted", "message": "drained for maintenance"})
    (again,) = platform.until_pods(jobs["drain"], 2)
    assert node_of(again) != drained and env_of(again)["GPUYARD_RESUME_URL"] == checkpoint
    job = platform.job(jobs["drain"])
    assert job["attempts"][0]["state"] == "LOST" and job["failures"] == 0  # not the job's fault
    platform.set_status([again], running())
    platform.set_status([again], exited(0))
    platform.until_state(jobs["drain"], "SUCCEEDED")

    # The leading scheduler is SIGKILLed while a job runs: the other leads and adopts its pod.
    jobs["adopted"] = platform.submit("adopted")
    (pod,) = platform.until_pods(jobs["adopted"], 1)
    platform.set_status([pod], running())
    wait_until(
        lambda: platform.job(jobs["adopted"])["attempts"][0]["state"] == "RUNNING", what="adopted running"
    )
    killed = platform.leader()
    platform.processes[killed].send_signal(signal.SIGKILL)
    platform.processes[killed].wait(timeout=10)
    assert platform.leader() != killed
    platform.set_status([pod], exited(0))
    done = platform.until_state(jobs["adopted"], "SUCCEEDED")
    assert [a["state"] for a in done["attempts"]] == ["SUCCEEDED"]  # adopted, not launched again

    # A node goes NotReady under a running pod: no one renews its lease; the job runs elsewhere.
    jobs["notready"] = platform.submit("notready")
    (pod,) = platform.until_pods(jobs["notready"], 1)
    platform.set_status([pod], running())
    wait_until(lambda: platform.job(jobs["notready"])["attempts"][0]["state"] == "RUNNING", what="running")
    lost_node = node_of(pod)
    cluster.api.patch_node_status(
        lost_node, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    (again,) = platform.until_pods(jobs["notready"], 2)
    assert node_of(again) not in (lost_node, drained)
    job = platform.job(jobs["notready"])
    assert job["attempts"][0]["state"] == "LOST" and job["failures"] == 0
    platform.set_status([again], running())
    platform.set_status([again], exited(0))
    platform.until_state(jobs["notready"], "SUCCEEDED")

    # One live attempt per job at any time: each began after the one before it ended.
    for job_id in jobs.values():
        spans = [(a["created_at"], a["ended_at"]) for a in platform.job(job_id)["attempts"]]
        assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)), spans
    # Every attempt's GPUs were its own while it lived, and nothing the launcher made is left.
    attempts = [(name, a) for name, job_id in jobs.items() for a in platform.job(job_id)["attempts"]]
    held: list[tuple[str, int, datetime, datetime, str]] = []
    for name, a in attempts:
        start, end = datetime.fromisoformat(a["created_at"]), datetime.fromisoformat(a["ended_at"])
        held += [(n["node"], gpu, start, end, name) for n in a["placement"]["nodes"] for gpu in n["gpus"]]
    for i, (node, gpu, start, end, name) in enumerate(held):
        for other in held[i + 1 :]:
            overlap = other[0] == node and other[1] == gpu and other[2] < end and start < other[3]
            assert not overlap, f"GPU {node}/{gpu} leased to {name} and {other[4]} at once"
    wait_until(
        lambda: (
            not [
                o
                for plural in ATTEMPT_PLURALS
                for o in cluster.objects(plural)
                if (o["metadata"].get("labels") or {}).get(m.MANAGED_BY) == "gpuyard"
            ]
        ),
        timeout_s=30,
        what="every object of the launcher deleted",
    )
    # what the namespace set-up made stays: it is the team's, not an attempt's
    assert [p["metadata"]["name"] for p in cluster.objects("networkpolicies")] == [m.DEFAULT_DENY]
