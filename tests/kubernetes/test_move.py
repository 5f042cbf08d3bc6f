"""One move between two sites end to end, with a real worker (issue 34, item 6): two emulated clusters
(sites a and b), each with its own S3 endpoint (moto's server on its gateway) and checkpoint store,
under one control plane (`gpuyard api`, `relay` and two `scheduler` replicas, as
tests/kubernetes/test_production.py runs them) configured with both sites (`sites`, each its own
kubeconfig, store and `checkpoint_store_options`) and a WAN (`moves`), so that a move may pay.

The training runtime on the fault suite's tiny model starts at a (b's only node is cordoned) and
checkpoints to a's store. Site a is drained (its node cordoned, the pod evicted: the worker
checkpoints and stops), b's node comes back: the scheduler moves the job, its mover copying the
checkpoint from a's store to b's with each site's own endpoint and credentials (the scheduler's
environment reaches neither), and the job resumes at b from the copied step and succeeds.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import psycopg
import pytest
from conftest import Cluster
from gpuyard.launchers.kubernetes import manifests as m
from local_cluster.agent import H100, NodeSpec
from local_cluster.apiserver import write_kubeconfig
from local_cluster.cluster import EmulatedCluster
from local_cluster.network import Bridge
from servers import S3Server, open_directory, wait_until
from test_production import IMAGE, POLL_S, TEAM_NS, Platform, env_of, train, training_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.requires(Bridge.possible(), "the pods' network namespaces need root and iproute2"),
]

SITES = ("a", "b")


@dataclass
class TwoSites:
    plane: Platform  # its `cluster` is site a's
    clusters: dict[str, EmulatedCluster]
    b: Cluster  # b's API, as the test reads it
    stores: dict[str, S3Server]
    database_url: str


def store_options(s3: S3Server) -> dict[str, str]:
    """A site's `checkpoint_store_options`: its S3 endpoint and credentials."""
    return {
        "endpoint_url": s3.url,
        "key": s3.CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "secret": s3.CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }


def cordon(cluster: EmulatedCluster, node: str, unschedulable: bool = True) -> None:
    cluster.api.patch_node(node, {"spec": {"unschedulable": unschedulable}})


@pytest.fixture
def two_sites(postgres_server: str, redis_url: str, tmp_path: Path) -> Iterator[TwoSites]:
    database = f"gpuyard_move_{uuid.uuid4().hex[:10]}"
    database_url = postgres_server.rsplit("/", 1)[0] + "/" + database
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    with open_directory() as carried:
        images = {IMAGE.split("@")[0]: training_image(carried)}
        nodes = {site: NodeSpec(f"gpu-{site}", gpus=1, cpu="8", memory="32Gi", labels=H100) for site in SITES}
        with (
            EmulatedCluster([nodes["a"]], images, tmp_path / "a", node_grace_s=5) as a,
            EmulatedCluster([nodes["b"]], images, tmp_path / "b", node_grace_s=5) as b,
        ):
            clusters = {"a": a, "b": b}
            stores = {site: S3Server(host=cluster.gateway).start() for site, cluster in clusters.items()}
            plane = Platform(
                Cluster(a.server.emulator, a.server.loop, a.url),
                database_url,
                redis_url,
                tmp_path / "plane",
                host=a.gateway,  # b's pods reach it too: this machine's address on a's bridge
            )
            sites: dict[str, Any] = {
                site: {"checkpoint_store": f"s3://ckpt-{site}", "checkpoint_store_options": store_options(s3)}
                for site, s3 in stores.items()
            }
            # b's secret as a Secret's envFrom gives it to the scheduler: the settings name it only
            sites["b"]["checkpoint_store_options"]["secret"] = {"from_env": "SITE_B_S3_SECRET"}
            plane.env["SITE_B_S3_SECRET"] = store_options(stores["b"])["secret"]
            # a: the platform's kubeconfig (KUBECONFIG); b: its own
            sites["b"]["kubernetes"] = {"kubeconfig": str(write_kubeconfig(b.url, tmp_path / "b.kubeconfig"))}
            plane.env |= {
                "GPUYARD_SITES": json.dumps(sites),
                "GPUYARD_KUBERNETES__ENV_FROM_SECRETS": '["object-store"]',  # each site's own endpoint
                "GPUYARD_KUBERNETES__REQUEST_TIMEOUT_S": "5",  # at most half the lease, for every site
                "GPUYARD_MOVES__WAN_GBIT_S": "1",
                "GPUYARD_MOVES__WAN_RTT_SECONDS": "0.01",
            }
            try:
                for site, s3 in stores.items():
                    s3.create_bucket(f"ckpt-{site}")
                cordon(b, "gpu-b")  # b has no room until a is drained: the job starts at a
                plane.up()  # the team's namespace applied at a
                at_b = Cluster(b.server.emulator, b.server.loop, b.url)
                at_b.apply(plane.namespaces())  # and at b
                for site, cluster in clusters.items():
                    secret = {"metadata": {"name": "object-store"}, "stringData": stores[site].env}
                    cluster.api.create_namespaced_secret(TEAM_NS, secret)
                yield TwoSites(plane, clusters, at_b, stores, database_url)
            finally:
                plane.stop()
                for s3 in stores.values():
                    s3.stop()
                with psycopg.connect(postgres_server, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def pods_at(cluster: Cluster, job_id: str, attempt: int) -> list[dict[str, Any]]:
    return [
        pod
        for pod in cluster.pods()
        if pod["metadata"]["annotations"].get(m.JOB_ID_ANNOTATION) == job_id
        and pod["metadata"]["annotations"].get(m.ATTEMPT_NUMBER_ANNOTATION) == str(attempt)
    ]


def test_a_job_moves_to_the_other_site_with_its_checkpoint_when_its_site_is_drained(
    two_sites: TwoSites,
) -> None:
    plane, clusters, stores = two_sites.plane, two_sites.clusters, two_sites.stores
    job_id = plane.submit("move", command=train(40, step_s=0.2), checkpoint={"url": "s3://ckpt-a/ml/move"})

    # It starts at a and checkpoints to a's store.
    (pod,) = plane.until_pods(job_id, 1)  # the platform's cluster is a's
    plane.until_checkpoint(job_id, 1)

    # Site a is drained: its node cordoned, the pod evicted (the worker checkpoints and stops); b's
    # node comes back.
    cordon(clusters["a"], "gpu-a")
    cordon(clusters["b"], "gpu-b", unschedulable=False)
    clusters["a"].evict(pod["metadata"]["name"], TEAM_NS)

    # The mover copies the stopped attempt's checkpoint from a's store to b's.
    moved = wait_until(
        lambda: next(
            (e["data"] for e in plane.job(job_id)["events"] if e["type"] == "job.checkpoint_moved"), None
        ),
        timeout_s=120,
        interval_s=POLL_S,
        what=f"job {job_id}'s checkpoint moved to b (logs in {plane.run})",
    )
    stopped = plane.job(job_id)["attempts"][0]
    assert stopped["state"] == "PREEMPTED" and stopped["placement"]["site"] == "a", stopped
    assert moved["from"] == stopped["checkpoint_url"] and moved["from"].startswith("s3://ckpt-a/ml/move/")
    assert moved["site"] == "b" and moved["to"].startswith(f"s3://ckpt-b/ml/{job_id}/")
    at_b = fsspec.filesystem("s3", **store_options(stores["b"]))
    manifest = json.loads(at_b.cat(f"{moved['to']}/manifest.json"))
    step = stopped["checkpoint_step"]
    assert manifest["step"] == step > 0
    copied = {path.removeprefix(moved["to"].removeprefix("s3://") + "/") for path in at_b.find(moved["to"])}
    assert copied == {*manifest["files"], "manifest.json"} and moved["files"] == len(copied)

    # The job resumes at b from the copy, at the copied step, and succeeds there.
    (again,) = wait_until(
        lambda: pods_at(two_sites.b, job_id, 2),
        timeout_s=120,
        interval_s=POLL_S,
        what=f"job {job_id} attempt 2's pod at b (logs in {plane.run})",
    )
    assert env_of(again)["GPUYARD_RESUME_URL"] == moved["to"]
    done = plane.until_state(job_id, "SUCCEEDED")
    assert [(a["state"], a["placement"]["site"]) for a in done["attempts"]] == [
        ("PREEMPTED", "a"),
        ("SUCCEEDED", "b"),
    ]
    assert done["failures"] == 0
    with psycopg.connect(two_sites.database_url) as conn:
        (resumed,) = conn.execute(
            "SELECT resume_step FROM attempts WHERE id = %s", (done["attempts"][1]["id"],)
        )
    assert resumed == (step,)  # what its workers restored, as they reported it
    assert done["attempts"][1]["checkpoint_url"].startswith(f"s3://ckpt-b/ml/{job_id}/")  # it writes at b
