"""The production profile with real workers, on the emulated cluster (deploy/local): `gpuyard api` (on
the cluster's gateway, where pods reach it), the relay and two schedulers with the Kubernetes launcher
as processes on PostgreSQL and Redis; the binder places the pods and the node agents run them, each
in network, mount and UTS namespaces of its own; checkpoints go to an S3 endpoint (moto's server on
the gateway) that the pods reach with their team's object-store Secret.

The workers are the real training runtime (`torchrun -m training.run`, DDP on gloo, DCP checkpoints
in S3, heartbeats) on the fault suite's tiny model:
- a gang of two pods on two nodes meets at its headless Service's name, trains and succeeds;
- a one-node job's node is lost mid-training (its processes die with it, it reports nothing more):
  the attempt is LOST once its lease runs out, the next one is placed on another node, resumes from
  the S3 checkpoint the store recorded, and succeeds; the failure budget is untouched.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import psycopg
import pytest
from conftest import Cluster
from faults.workload import write_runtime_config
from local_cluster.agent import NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.images import LocalImage, python_image
from local_cluster.network import Bridge
from servers import S3Server, open_directory, wait_until
from test_production import IMAGE, TEAM_NS, Platform, env_of, node_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.skipif(not Bridge.possible(), reason="the pods' network namespaces need root and iproute2"),
]


@pytest.fixture
def platform(
    postgres_server: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[Platform, EmulatedCluster, S3Server]]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    nodes = [
        NodeSpec(name, gpus=1, cpu="8", memory="32Gi", labels={**labels, "gpuyard.io/domain": "rack-1"})
        for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
    ]
    database = f"gpuyard_e2e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    with (
        open_directory() as carried,
        EmulatedCluster(
            nodes, {IMAGE.split("@")[0]: training_image(carried)}, tmp_path / "nodes", node_grace_s=5
        ) as emulated,
    ):
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
            store = {**s3.env, "AWS_ENDPOINT_URL": s3.url}
            emulated.api.create_namespaced_secret(
                TEAM_NS, {"metadata": {"name": "object-store"}, "stringData": store}
            )
            yield made, emulated, s3
        finally:
            made.stop()
            s3.stop()
            with psycopg.connect(postgres_server, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


REPO = Path(__file__).resolve().parents[2]  # the editable install's sources (gpuyard, training)
CARRIED = "/opt/train"  # where the training image carries its configuration and data
WORKDIR = "/var/lib/gpuyard"  # the image's, as the Dockerfile's: the pod's work volume


def training_image(directory: Path) -> LocalImage:
    """This machine's Python with the fault suite's tiny model: its config and data in the image."""
    config = json.loads(write_runtime_config(directory).read_text())
    config["data"]["path"] = f"{CARRIED}/runtime.parquet"
    (directory / "runtime.yaml").write_text(json.dumps(config))
    return python_image(files={CARRIED: str(directory)}, sources=(str(REPO),), workdir=WORKDIR)


def train(steps: int, step_s: float = 0.15, *, torchrun: bool = True) -> list[str]:
    """The runtime's command: under torchrun (a gang), or alone (one process: torch imported once)."""
    config = f"{CARRIED}/runtime.yaml"
    settings = ["--set", f"train.max_steps={steps}", "--set", f"train.step_sleep_s={step_s}"]
    launcher = ["torchrun", "-m"] if torchrun else ["python", "-m"]
    return [*launcher, "training.run", "--config", config, *settings]


def checkpoints(s3: S3Server, url: str) -> list[str]:
    """The step folders under a job's checkpoint URL, as the test reads the bucket."""
    key, secret = s3.CREDENTIALS["AWS_ACCESS_KEY_ID"], s3.CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    fs = fsspec.filesystem("s3", endpoint_url=s3.url, key=key, secret=secret)
    return sorted(path.rsplit("/", 1)[1] for path in fs.ls(url.removeprefix("s3://")))


def test_real_workers_meet_train_checkpoint_to_s3_and_resume_after_a_node_is_lost(
    platform: tuple[Platform, EmulatedCluster, S3Server],
) -> None:
    plane, cluster, s3 = platform
    gang = plane.submit("gang", command=train(10), resources={"gpus": 2, "gpu_types": ["h100"], "nodes": 2})
    # beside it, one long enough to be cut off after its first checkpoint however slow this machine is
    lone = plane.submit("lone", command=train(60, step_s=0.4, torchrun=False), retry={"max_failures": 0})
    assert len({node_of(p) for p in plane.until_pods(gang, 1, count=2)}) == 2

    (first,) = plane.until_pods(lone, 1)
    wait_until(
        lambda: plane.job(lone)["attempts"][0]["checkpoint_step"],
        timeout_s=120,
        what="the lone job's first recorded checkpoint",
    )
    cluster.agents[node_of(first)].lose()
    (again,) = plane.until_pods(lone, 2)
    lost = plane.job(lone)["attempts"][0]
    assert lost["state"] == "LOST" and lost["checkpoint_step"] < 60  # it was cut off mid-training
    assert node_of(again) != node_of(first) and env_of(again)["GPUYARD_RESUME_URL"] == lost["checkpoint_url"]

    done = plane.until_state(gang, "SUCCEEDED", timeout_s=180)
    assert [a["state"] for a in done["attempts"]] == ["SUCCEEDED"], done["attempts"]
    assert "step-000000010-t1" in checkpoints(s3, "s3://ckpt/ml/gang")  # the final one, by attempt 1
    job = plane.until_state(lone, "SUCCEEDED", timeout_s=180)
    assert [a["state"] for a in job["attempts"]] == ["LOST", "SUCCEEDED"] and job["failures"] == 0
