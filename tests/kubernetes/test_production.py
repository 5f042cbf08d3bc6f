"""The production profile end to end, with real workers, on the emulated cluster (deploy/local):
`gpuyard migrate`, `gpuyard api` (2 workers, on the cluster's gateway, where pods reach it),
`gpuyard relay` and two `gpuyard scheduler` replicas with the Kubernetes launcher as processes on
PostgreSQL and Redis (local_cluster.control_plane); the binder places the pods and the node agents run
them, each in network, mount and UTS namespaces of its own; checkpoints go to an S3 endpoint (moto's
server on the gateway) that the pods reach with their team's object-store Secret. The team's namespace
is what `gpuyard kubernetes namespaces` prints, applied as a cluster admin would.

The workers are the real training runtime (`python -m training.run`: DDP on gloo, DCP checkpoints in
S3, heartbeats) on the fault suite's tiny model:
- a gang of two pods on two nodes meets at its headless Service's name, trains and succeeds; its
  Service and NetworkPolicy are the gang's own;
- a one-node job's node is lost mid-training (its processes die with it, it reports nothing more): the
  attempt is LOST once its lease runs out, the next one is placed on another node and resumes from the
  S3 checkpoint the store recorded; the failure budget is untouched;
- a node drained (cordoned, its pod evicted: DisruptionTarget, SIGTERM): the worker checkpoints and
  stops, the job resumes from that checkpoint on another node, its failure budget untouched;
- an image that cannot be pulled: the job fails, naming it;
- the leading scheduler SIGKILLed while a job runs: the other takes over and adopts its pod.
The scenarios overlap in time, as on a real cluster: the first three start together.
At the end: never two live attempts of a job, never a GPU leased to two attempts at once, and no object
the launcher made (pods, Services, Secrets, NetworkPolicies) left in the cluster.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import fsspec
import httpx
import psycopg
import pytest
from conftest import NAMESPACE, Cluster, assert_valid
from faults.workload import write_runtime_config
from gpuyard.launchers.kubernetes import manifests as m
from local_cluster.agent import H100, NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.control_plane import ControlPlane, settings
from local_cluster.images import LocalImage, python_image
from local_cluster.network import Bridge
from servers import S3Server, free_port, open_directory, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.starts_first,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.requires(Bridge.possible(), "the pods' network namespaces need root and iproute2"),
]

IMAGE = "registry.example/train@sha256:" + "a" * 64  # production admits images pinned by digest only
PRIVATE = "registry.example/private@sha256:" + "b" * 64  # a registry that refuses this cluster
LEASE_S = 20  # a pass on this loaded 2-core machine may take seconds: the leader lease is half of it
TEAM_NS = "gpuyard-team-ml"
ATTEMPT_PLURALS = ("pods", "services", "secrets", "networkpolicies")
REPO = Path(__file__).resolve().parents[2]  # the editable install's sources (gpuyard, training)
CARRIED = "/opt/train"  # where the training image carries its configuration and data
WORKDIR = "/var/lib/gpuyard"  # the image's, as the Dockerfile's: the pod's work volume
POLL_S = 0.5  # what the test waits for takes seconds: polling faster only loads the API and this machine


class Platform(ControlPlane):
    """The control plane's processes (local_cluster.control_plane), and the calls the test makes as
    users and operators."""

    def __init__(self, cluster: Cluster, database_url: str, redis_url: str, run: Path, host: str):
        """`host`: where the API listens (the emulated cluster's gateway, for its pods' heartbeats)."""
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
        stream = {"GPUYARD_REDIS_STREAM": f"gpuyard:e2e:{uuid.uuid4().hex[:8]}"}
        super().__init__(run, {**outside, **env, **stream}, host=host, port=port)
        self.cluster = cluster
        self.http = httpx.Client(base_url=self.url, timeout=30)  # one client: each new one loads the CAs

    def stop(self) -> None:  # type: ignore[override]
        self.http.close()
        super().stop()

    def up(self) -> None:  # type: ignore[override]
        self.gpuyard("migrate")
        self.http.headers["Authorization"] = f"Bearer {self.team_token('ml', 'the end-to-end test')}"
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
            "command": train(20),
            "resources": {"gpus": 1, "gpu_types": ["h100"], "nodes": 1},
            "retry": {"max_failures": 0},
            "checkpoint": {"url": f"s3://ckpt/ml/{name}"},  # under team ml's root
            **overrides,
        }
        answer = self.http.post("/v1/jobs", json=spec, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def until_state(self, job_id: str, state: str, timeout_s: float = 180) -> dict[str, Any]:
        return dict(
            wait_until(
                lambda: (job := self.job(job_id))["state"] == state and job,
                timeout_s=timeout_s,
                interval_s=POLL_S,
                what=f"job {job_id} {state} (logs in {self.run})",
            )
        )

    def until_checkpoint(self, job_id: str, attempt: int) -> int:
        return int(
            wait_until(
                lambda: self.job(job_id)["attempts"][attempt - 1]["checkpoint_step"],
                timeout_s=150,
                interval_s=POLL_S,
                what=f"job {job_id} attempt {attempt}'s first recorded checkpoint (logs in {self.run})",
            )
        )

    # -- as operators -------------------------------------------------------------------------------

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
                timeout_s=120,
                interval_s=POLL_S,
                what=f"{count} pod(s) of job {job_id} attempt {attempt} (logs in {self.run})",
            )
        )


def node_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["annotations"][m.NODE_ANNOTATION])


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def secret_of(plane: Platform, pod: dict[str, Any], name: str) -> str:
    """A value of the pod's attempt's Secret, as its worker reads it (GPUYARD_FENCING_TOKEN, ...)."""
    key = pod["metadata"]["labels"][m.ATTEMPT_LABEL]
    (secret,) = [s for s in plane.cluster.objects("secrets") if s["metadata"]["name"] == key]
    return base64.b64decode(secret["data"][name]).decode()


def training_image(directory: Path) -> LocalImage:
    """This machine's Python with the fault suite's tiny model: its config and data in the image."""
    config = json.loads(write_runtime_config(directory).read_text())
    config["data"]["path"] = f"{CARRIED}/runtime.parquet"
    (directory / "runtime.yaml").write_text(json.dumps(config))
    return python_image(files={CARRIED: str(directory)}, sources=(str(REPO),), workdir=WORKDIR)


def train(steps: int, step_s: float = 0.15) -> list[str]:
    """The runtime's command, one process per pod: it starts the pod's ranks itself (training/ranks.py)."""
    settings = ["--set", f"train.max_steps={steps}", "--set", f"train.step_sleep_s={step_s}"]
    return ["python", "-m", "training.run", "--config", f"{CARRIED}/runtime.yaml", *settings]


def checkpoints(s3: S3Server, url: str) -> list[str]:
    """The step folders under a job's checkpoint URL, as the test reads the bucket."""
    key, secret = s3.CREDENTIALS["AWS_ACCESS_KEY_ID"], s3.CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    fs = fsspec.filesystem("s3", endpoint_url=s3.url, key=key, secret=secret)
    return sorted(path.rsplit("/", 1)[1] for path in fs.ls(url.removeprefix("s3://")))


@pytest.fixture
def platform(
    postgres_server: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[Platform, EmulatedCluster, S3Server]]:
    nodes = [
        NodeSpec(name, gpus=1, cpu="8", memory="32Gi", labels={**H100, "gpuyard.io/domain": "rack-1"})
        for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
    ]
    database = f"gpuyard_e2e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    with open_directory() as carried:
        images = {
            IMAGE.split("@")[0]: training_image(carried),
            PRIVATE.split("@")[0]: LocalImage(pull_error="unauthorized: authentication required"),
        }
        with EmulatedCluster(nodes, images, tmp_path / "nodes", node_grace_s=5) as emulated:
            s3 = S3Server(host=emulated.gateway).start()
            made = Platform(
                Cluster(emulated.server.emulator, emulated.server.loop, emulated.url),
                postgres_server.rsplit("/", 1)[0] + "/" + database,
                redis_url,
                tmp_path,
                host=emulated.gateway,
            )
            made.env["GPUYARD_KUBERNETES__ENV_FROM_SECRETS"] = '["object-store"]'
            try:
                s3.create_bucket("ckpt")
                made.up()
                emulated.api.create_namespaced_secret(
                    TEAM_NS, {"metadata": {"name": "object-store"}, "stringData": s3.env}
                )
                yield made, emulated, s3
            finally:
                made.stop()
                s3.stop()
                with psycopg.connect(postgres_server, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_the_production_profile_end_to_end_with_real_workers(
    platform: tuple[Platform, EmulatedCluster, S3Server],
) -> None:
    plane, cluster, s3 = platform
    # The scenarios overlap, as a cluster's do (one GPU per node, four nodes): a gang of two, one job
    # whose node will be lost and one that will be drained start together, each long enough to be cut
    # off after its first checkpoint however slow this machine is; the drained one long enough to
    # outlive a leader's failover after its resume.
    jobs = {
        "gang": plane.submit(
            "gang", command=train(10), resources={"gpus": 2, "gpu_types": ["h100"], "nodes": 2}
        ),
        "lone": plane.submit("lone", command=train(60, step_s=0.4)),
        "drain": plane.submit("drain", command=train(150, step_s=0.2)),
    }

    # The gang's two pods meet at its headless Service's name, open to the gang only.
    gang = plane.until_pods(jobs["gang"], 1, count=2)
    key = gang[0]["metadata"]["labels"][m.ATTEMPT_LABEL]
    (service,) = [s for s in plane.cluster.objects("services") if s["metadata"]["name"] == key]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {m.ATTEMPT_LABEL: key}
    (policy,) = [p for p in plane.cluster.objects("networkpolicies") if p["metadata"]["name"] == key]
    gang_only = {"podSelector": {"matchLabels": {m.ATTEMPT_LABEL: key}}}
    assert policy["spec"]["podSelector"] == gang_only["podSelector"]
    assert policy["spec"]["ingress"] == [{"from": [gang_only]}]  # the rendezvous port opens to the gang only
    rendezvous = f"{key}-0.{key}.{TEAM_NS}.svc.cluster.local"
    assert [env_of(p)["MASTER_ADDR"] for p in gang] == [rendezvous, rendezvous]
    assert len({node_of(p) for p in gang}) == 2

    # The lone job's node is lost after its first checkpoint (its processes die with it, it reports
    # nothing more).
    (lone,) = plane.until_pods(jobs["lone"], 1)
    plane.until_checkpoint(jobs["lone"], 1)
    lost_node = node_of(lone)
    cluster.agents[lost_node].lose()

    # The drained job's heartbeat takes the attempt's secret, which only its pods get (from the
    # attempt's Secret): the fencing token alone proves nothing.
    (drained_pod,) = plane.until_pods(jobs["drain"], 1)
    plane.until_checkpoint(jobs["drain"], 1)
    attempt = plane.job(jobs["drain"])["attempts"][0]
    url = f"/v1/attempts/{attempt['id']}/heartbeat"
    body = {
        "fencing_token": int(secret_of(plane, drained_pod, m.FENCING_TOKEN_KEY)),
        "step": attempt["step"] or 0,
    }
    assert plane.http.post(url, json=body).status_code == 401
    bearer = {"Authorization": f"Bearer {secret_of(plane, drained_pod, m.ATTEMPT_SECRET_KEY)}"}
    assert plane.http.post(url, json=body, headers=bearer).status_code == 200
    # Its node is drained (cordoned, the pod evicted: DisruptionTarget, SIGTERM): the worker
    # checkpoints and stops.
    drained = node_of(drained_pod)
    cluster.api.patch_node(drained, {"spec": {"unschedulable": True}})
    cluster.evict(drained_pod["metadata"]["name"], TEAM_NS)

    # Both resume from their S3 checkpoints on the nodes the gang leaves, their failure budgets untouched:
    # the lost one once its lease runs out (LOST), the drained one once it stopped.
    done = plane.until_state(jobs["gang"], "SUCCEEDED")
    assert [a["state"] for a in done["attempts"]] == ["SUCCEEDED"], done["attempts"]
    assert "step-000000010-t1" in checkpoints(s3, "s3://ckpt/ml/gang")  # the final one, by attempt 1
    (again,) = plane.until_pods(jobs["lone"], 2)
    lost = plane.job(jobs["lone"])["attempts"][0]
    assert lost["state"] == "LOST" and lost["checkpoint_step"] < 60  # it was cut off mid-training
    assert node_of(again) != lost_node and env_of(again)["GPUYARD_RESUME_URL"] == lost["checkpoint_url"]
    (again,) = plane.until_pods(jobs["drain"], 2)
    stopped = plane.job(jobs["drain"])["attempts"][0]
    assert node_of(again) not in (drained, lost_node)
    assert env_of(again)["GPUYARD_RESUME_URL"] == stopped["checkpoint_url"]
    assert stopped["state"] in ("PREEMPTED", "LOST") and plane.job(jobs["drain"])["failures"] == 0
    cluster.api.patch_node(drained, {"spec": {"unschedulable": False}})  # the drain is over

    # An image that cannot be pulled (on the node the drain gave back): the job fails, naming the
    # image's registry's reason.
    jobs["pull"] = plane.submit("pull", image=PRIVATE)
    failed = plane.until_state(jobs["pull"], "FAILED")
    assert "ErrImagePull" in failed["attempts"][0]["reason"], failed["attempts"][0]

    # The leading scheduler is SIGKILLed while the drained job runs again: the other leads and adopts
    # its pod.
    adopted = plane.until_state(jobs["drain"], "RUNNING")
    assert len(adopted["attempts"]) == 2
    killed = plane.leader()
    plane.processes[killed].send_signal(signal.SIGKILL)
    plane.processes[killed].wait(timeout=10)
    assert plane.leader() != killed
    done = plane.until_state(jobs["drain"], "SUCCEEDED")
    assert [a["state"] for a in done["attempts"]][1:] == ["SUCCEEDED"]  # adopted, not launched again
    job = plane.until_state(jobs["lone"], "SUCCEEDED")
    assert [a["state"] for a in job["attempts"]] == ["LOST", "SUCCEEDED"] and job["failures"] == 0
    cluster.api.delete_node(lost_node)  # the operator's word that the machine is gone: its pods go

    # One live attempt per job at any time: each began after the one before it ended.
    for job_id in jobs.values():
        spans = [(a["created_at"], a["ended_at"]) for a in plane.job(job_id)["attempts"]]
        assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)), spans
    # Every attempt's GPUs were its own while it lived, and nothing the launcher made is left.
    attempts = [(name, a) for name, job_id in jobs.items() for a in plane.job(job_id)["attempts"]]
    held: list[tuple[str, int, datetime, datetime, str]] = []
    for name, a in attempts:
        start, end = datetime.fromisoformat(a["created_at"]), datetime.fromisoformat(a["ended_at"])
        held += [(n["node"], gpu, start, end, name) for n in a["placement"]["nodes"] for gpu in n["gpus"]]
    for i, (node, gpu, start, end, name) in enumerate(held):
        for other in held[i + 1 :]:
            overlap = other[0] == node and other[1] == gpu and other[2] < end and start < other[3]
            assert not overlap, f"GPU {node}/{gpu} leased to {name} and {other[4]} at once"

    def left() -> list[str]:
        return [
            f"{plural}/{o['metadata']['name']}"
            for plural in ATTEMPT_PLURALS
            for o in plane.cluster.objects(plural)
            if (o["metadata"].get("labels") or {}).get(m.MANAGED_BY) == "gpuyard"
        ]

    with contextlib.suppress(AssertionError):
        wait_until(lambda: not left(), timeout_s=60, what="every object of the launcher deleted")
    assert not left(), f"the launcher's objects left: {left()}"
    # what the namespace set-up made stays: it is the team's, not an attempt's
    assert [p["metadata"]["name"] for p in plane.cluster.objects("networkpolicies")] == [m.DEFAULT_DENY]
