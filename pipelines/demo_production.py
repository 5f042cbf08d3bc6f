"""`make demo-production`: the flights_delay retraining DAG, run through Airflow against gpuyard's
production topology on this one machine.

1. the servers: PostgreSQL (the machine's when it answers, else a throwaway one) with a database for
   gpuyard and one for MLflow, Redis (likewise), an S3 endpoint (moto's server) with a bucket for
   checkpoints and one for MLflow's artifacts;
2. the emulated Kubernetes cluster (deploy/local): 4 nodes of 2 GPUs in two domains (the GPUs are
   counted, not real: training runs on CPU), whose node agents run the pods as local processes in
   namespaces of their own, from a training image built from this checkout's wheel: the runtime and
   the pipeline's configuration installed inside it, nothing of the checkout on the pods' paths;
3. the control plane: `gpuyard migrate`, `gpuyard api` (2 workers), `gpuyard relay` and two
   `gpuyard scheduler` replicas with the Kubernetes launcher, team a's namespace applied as a cluster
   admin would, its Secrets (the object store's credentials, its MLflow user), the MLflow tracking
   server on PostgreSQL with its artifacts in S3;
4. `airflow dags test flights_delay` with the training jobs on the cluster's H100 nodes, their image
   and checkpoint root from the deployment's Airflow Variables;
5. ONE injected node loss: once a training job has a checkpoint in S3, the node running its worker is
   lost (its processes die, it reports nothing more); the attempt is LOST when its lease runs out and
   the job resumes from its S3 checkpoint on another node;
6. the outcome (as `make demo` shows it), then the line
   `RESULT profile=production launcher=kubernetes store=postgresql bus=redis checkpoints=s3 attempts=A
   lost_steps=L demo_seconds=S` (A and L of the job whose node was lost).

Everything starts fresh each time, under .gpuyard/demo-production (logs included), and stops at the end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from gpuyard_client import GpuyardClient, resolve_endpoint
from local_cluster.agent import H100, NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.control_plane import object_store_secret, on_cluster
from local_cluster.images import installed_image
from local_cluster.services import (
    MACHINE_POSTGRES,
    MACHINE_REDIS,
    S3Server,
    running_or_throwaway,
    throwaway_database,
    throwaway_postgres,
    throwaway_redis,
)

from pipelines import demo, mlflow_access
from pipelines.definition import (
    CHECKPOINT_ROOT_VARIABLE,
    HOME_VARIABLE,
    REPOSITORY,
    TRAINING_IMAGE_VARIABLE,
    load_definition,
)
from pipelines.demo import BIN, PIPELINE, console
from pipelines.tracking_server import TrackingServer

HOME = REPOSITORY / ".gpuyard" / "demo-production"
TEAM = "a"
TEAM_NAMESPACE = f"gpuyard-team-{TEAM}"
# The training image, pinned by digest as production admits images; the emulated registry maps its
# repository to the project's wheel, built from this checkout when the demo starts and installed at
# /opt/gpuyard/lib (the pipeline's definition inside it) over this machine's third-party packages.
TRAINING_IMAGE = "registry.gpuyard.local/flights-delay-train@sha256:" + "7" * 64
GPU_TYPE = "h100"
LEASE_S, GRACE_S = 20, 10


def nodes() -> list[NodeSpec]:
    """4 nodes of 2 GPUs, two per domain (rack), that mount the demo's folder as every node of a
    cluster mounts its shared file system: the data root, where the training sets and jobs' work lie."""
    return [
        NodeSpec(
            name,
            gpus=2,
            cpu="8",
            memory="32Gi",
            labels={**H100, "gpuyard.io/domain": rack},
            shared=(str(HOME),),
        )
        for name, rack in (("gpu-a", "rack-1"), ("gpu-b", "rack-1"), ("gpu-c", "rack-2"), ("gpu-d", "rack-2"))
    ]


def secret(name: str, values: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": TEAM_NAMESPACE}} | {
        "stringData": values
    }


class NodeLoss(threading.Thread):
    """Loses the node of the first training job's worker once, after its first checkpoint in S3."""

    def __init__(self, admin: GpuyardClient, cluster: EmulatedCluster) -> None:
        super().__init__(name="demo-node-loss", daemon=True)
        self.admin, self.cluster = admin, cluster
        self.job: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        if (event := demo.first_checkpoint(self.admin, self.stop)) is not None:
            self.lose(event)

    def lose(self, event: dict[str, Any]) -> None:
        attempt = next(
            a for a in self.admin.job(event["job_id"])["attempts"] if a["id"] == event["attempt_id"]
        )
        node = attempt["placement"]["nodes"][0]["node"]
        self.cluster.agents[node].lose()
        self.job = event["job_id"]
        console.print(
            f"  [bold yellow]⚡ injected node loss[/]: {node}, running attempt {attempt['number']} of job "
            f"{self.job}, after its checkpoint at step {event['data'].get('step')} "
            f"({event['data'].get('url')})"
        )


def result(admin: GpuyardClient, job_id: str | None, seconds: float) -> str:
    """The RESULT line: the attempts of the job whose node was lost, and the steps it lost."""
    attempts = admin.job(job_id)["attempts"] if job_id else []
    lost = sum(
        max(0, (a["step"] or 0) - (a["checkpoint_step"] or 0))
        for a in attempts
        if a["state"] in ("LOST", "PREEMPTED")
    )
    return (
        "RESULT profile=production launcher=kubernetes store=postgresql bus=redis checkpoints=s3 "
        f"attempts={len(attempts)} lost_steps={lost} demo_seconds={seconds:.0f}"
    )


def main() -> int:
    started = time.monotonic()
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # the emulated API server's every request
    # Stopped with SIGTERM as with Ctrl-C: everything it started stops with it (the ExitStack below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    shutil.rmtree(HOME, ignore_errors=True)
    (HOME / "airflow").mkdir(parents=True)
    os.environ[HOME_VARIABLE] = str(HOME)  # the definition's data root, for this process too
    definition = load_definition(PIPELINE)
    env = demo.environment() | {HOME_VARIABLE: str(HOME)}
    with contextlib.ExitStack() as stack:
        console.rule("1. PostgreSQL, Redis and an S3 endpoint")
        postgres = stack.enter_context(
            running_or_throwaway(MACHINE_POSTGRES, throwaway_postgres, HOME / "pg")
        )
        redis_url = stack.enter_context(running_or_throwaway(MACHINE_REDIS, throwaway_redis, HOME / "redis"))
        gpuyard_db = stack.enter_context(throwaway_database(postgres, "gpuyard_demo"))
        mlflow_db = stack.enter_context(throwaway_database(postgres, "mlflow_demo"))
        console.print(
            f"PostgreSQL {postgres.rsplit('/', 1)[0]} (databases {gpuyard_db.rsplit('/', 1)[1]}, "
            f"{mlflow_db.rsplit('/', 1)[1]}), Redis {redis_url}"
        )

        console.rule("2. the emulated cluster: 4 nodes x 2 GPUs (H100 labels, CPU underneath) in two racks")
        console.print("building the training image: this checkout's wheel, installed at /opt/gpuyard/lib")
        # the definition's relative path resolves there; gpuyard's HTTP client is its wheel beside
        image = installed_image(REPOSITORY, HOME / "image", beside=[REPOSITORY / "clients" / "python"])
        cluster = stack.enter_context(
            EmulatedCluster(nodes(), {TRAINING_IMAGE.split("@")[0]: image}, HOME / "nodes", node_grace_s=10)
        )
        s3 = S3Server(host=cluster.gateway).start()
        stack.callback(s3.stop)
        checkpoints, artifacts = s3.create_bucket("checkpoints"), s3.create_bucket("mlflow")
        console.print(
            f"API server {cluster.url}; pods on the bridge, this machine at {cluster.gateway}; "
            f"S3 at {s3.url} ({checkpoints}, {artifacts})"
        )

        console.rule("3. the control plane: migrate, api x2, relay, scheduler x2 (Kubernetes launcher)")
        plane = on_cluster(
            cluster,
            s3,
            HOME / "gpuyard",
            env,
            database_url=gpuyard_db,
            redis_url=redis_url,
            lease_s=LEASE_S,
            grace_s=GRACE_S,
            checkpoint_store=checkpoints,
            stream="demo-production",
        )
        api_url = plane.url
        plane.gpuyard("migrate")
        token = plane.team_token(TEAM, "make demo-production: Airflow")
        admin_token = json.loads(
            plane.gpuyard("token", "create", "--team", TEAM, "--role", "platform-admin", "--json")
        )["token"]
        plane.apply_namespaces(cluster.server.emulator, cluster.api)
        stack.callback(plane.stop)
        with console.status("starting gpuyard's processes"):
            plane.up()
        admin = GpuyardClient(resolve_endpoint(url=api_url, token=admin_token))
        console.print(
            f"gpuyard at {api_url}: {plane.leader()} leads; team {TEAM}'s namespace {TEAM_NAMESPACE}"
        )

        tracking = TrackingServer(
            HOME / "mlflow",
            HOME / "mlflow.log",
            env | s3.env,
            artifacts=f"{artifacts}/artifacts",
            host=cluster.gateway,
            backend=mlflow_db.replace("postgresql://", "postgresql+psycopg://"),
        )
        with console.status(
            "starting the MLflow tracking server on PostgreSQL (a first start creates its schema)"
        ):
            os.environ["MLFLOW_TRACKING_URI"] = tracking.start().url
        stack.callback(tracking.stop)
        pipeline = tracking.provision((TEAM,))
        os.environ.update(pipeline.env())  # this process reads the outcome as the pipeline
        team_user = tracking.credentials(mlflow_access.team_user(TEAM))
        cluster.server.emulator.apply(
            cluster.api.api_client,
            [
                object_store_secret(TEAM_NAMESPACE, s3),  # the pods' credentials for the checkpoint bucket
                secret(  # what the jobs' env_from_secret names: team a's MLflow user
                    f"gpuyard-team-{TEAM}",
                    {
                        mlflow_access.USERNAME_SECRET: team_user.username,
                        mlflow_access.PASSWORD_SECRET: team_user.password,
                    },
                ),
            ],
        )
        console.print(f"MLflow at {tracking.url} on PostgreSQL, artifacts in {artifacts}")

        connection = {"conn_type": "gpuyard", "host": api_url, "password": token}
        airflow_env = (
            demo.airflow_environment(connection, tracking.url)
            | pipeline.env()
            | {
                HOME_VARIABLE: str(HOME),
                "AIRFLOW_HOME": str(HOME / "airflow"),
                f"AIRFLOW_VAR_{TRAINING_IMAGE_VARIABLE.upper()}": TRAINING_IMAGE,
                f"AIRFLOW_VAR_{CHECKPOINT_ROOT_VARIABLE.upper()}": f"{checkpoints}/{TEAM}",
            }
        )
        subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"], env=airflow_env, capture_output=True, check=True
        )
        window = definition.window()
        console.rule(
            f"4. airflow dags test {PIPELINE}: {window.prepare_start}..{window.run_date} of 2013 flights, "
            f"{len(definition.job.grid)} training jobs on the cluster's {GPU_TYPE} nodes"
        )
        loss = NodeLoss(admin, cluster)
        loss.start()
        dag_test = subprocess.Popen(
            [str(BIN / "airflow"), "dags", "test", PIPELINE, "-c", json.dumps({"gpu_type": GPU_TYPE})],
            env=airflow_env,
            cwd=REPOSITORY,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        demo.follow(dag_test, HOME / "dags-test.log")
        code = dag_test.wait()
        loss.stop.set()
        if code != 0 or "DagRun Finished" not in (HOME / "dags-test.log").read_text():
            console.print(f"[red]the DAG run failed[/]; the whole log: {HOME / 'dags-test.log'}")
            return 1
        if loss.job is None:
            console.print("[red]the training jobs ended before the injected node loss could land[/]")
            return 1
        demo.summary(admin, HOME / "airflow" / "airflow.db", slots="emulated H100s, trained on CPU")
        line = result(admin, loss.job, time.monotonic() - started)
        console.print(f"[dim]logs of every process in {HOME}[/]")
        print(line, flush=True)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
