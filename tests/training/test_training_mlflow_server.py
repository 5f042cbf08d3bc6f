"""Production's MLflow: the tracking server as deploy/mlflow.yaml runs it (PostgreSQL backend, served
artifacts, the basic-auth app with its user store in PostgreSQL), and a training job that logs to it
through MLFLOW_TRACKING_URI, as the Kubernetes launcher sets it in worker pods, with its team's MLflow
credentials. The review found workers logging to a SQLite file inside the pod."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from gpuyard_client import tls_context
from servers import free_port, wait_until
from trainkit import run_workers, write_config

from pipelines import mlflow_access
from training import exit_codes
from training.mlflow_tracking import JOB_TAG

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
ADMIN = mlflow_access.Credentials(mlflow_access.ADMIN, mlflow_access.new_password())
MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "mlflow.yaml"


def server_args(backend: str, artifacts: str, port: int) -> list[str]:
    """The manifest's `mlflow server` arguments, with this machine's addresses and stores."""
    (_auth, deployment, _service) = yaml.safe_load_all(MANIFEST.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    values = {"$(MLFLOW_BACKEND_STORE_URI)": backend, "$(MLFLOW_ARTIFACTS_DESTINATION)": artifacts}
    args = []
    for arg in container["args"]:
        for name, value in values.items():
            arg = arg.replace(name, value)
        if arg.startswith("--host="):
            arg = "--host=127.0.0.1"
        elif arg.startswith("--port="):
            arg = f"--port={port}"
        elif arg.startswith("--allowed-hosts="):
            arg += f",127.0.0.1:{port}"
        args.append(arg)
    return [*container["command"], *args]


def manifest_env() -> dict[str, str]:
    """The container's plain-valued environment (not HOME: this machine's user keeps its own)."""
    (_auth, deployment, _service) = yaml.safe_load_all(MANIFEST.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"] != "HOME"}


def auth_config(database: str) -> str:
    """The manifest's basic-auth configuration, its user store on this machine's PostgreSQL."""
    (auth, _deployment, _service) = yaml.safe_load_all(MANIFEST.read_text())
    lines = auth["data"]["basic_auth.ini"].splitlines()
    replaced = [f"database_uri = {database}" if line.startswith("database_uri") else line for line in lines]
    return "\n".join(replaced)


@pytest.fixture
def mlflow_server(postgres_server: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    name = f"mlflow_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f'CREATE DATABASE "{name}_auth"')
    base = "postgresql+psycopg://" + postgres_server.split("://", 1)[1].rsplit("/", 1)[0]
    backend = f"{base}/{name}"
    artifacts = tmp_path / "object-store"
    port = free_port()
    command = server_args(backend, artifacts.as_uri(), port)
    command[0] = str(Path(sys.executable).parent / command[0])  # this environment's mlflow
    log = tmp_path / "mlflow.log"
    (tmp_path / "basic_auth.ini").write_text(auth_config(f"{base}/{name}_auth"))
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        | manifest_env()
        | {
            "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "basic_auth.ini"),
            "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN.password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": mlflow_access.new_password(),
        }
    )
    server = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/health", timeout=1, verify=tls_context()).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(
            healthy, timeout_s=120, interval_s=0.2, what=f"the MLflow server (log: {log})"
        )  # creates its schema
        yield url, artifacts, f"{postgres_server.rsplit('/', 1)[0]}/{name}_auth"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP DATABASE IF EXISTS "{name}_auth" WITH (FORCE)')


def test_a_training_job_logs_its_run_and_model_to_the_tracking_server(
    mlflow_server: tuple[str, Path, str],
    tmp_path: Path,
    flights_parquet: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, object_store, users = mlflow_server
    pipeline = mlflow_access.Credentials(mlflow_access.PIPELINE, mlflow_access.new_password())
    team = mlflow_access.Credentials(mlflow_access.team_user("a"), mlflow_access.new_password())
    mlflow_access.provision(url, ADMIN, pipeline, {"a": team})
    for name, value in pipeline.env().items():  # this process: the pipeline's identity
        monkeypatch.setenv(name, value)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url, registry_uri=url)
    experiment_id = client.create_experiment("flights")
    mlflow_access.grant_team(url, "a", experiment_id, "flight-delay", pipeline)
    mlflow_access.grant_team(url, "a", experiment_id, "flight-delay", pipeline)  # every DAG run grants
    config, work = write_config(
        tmp_path,
        flights_parquet,
        train={"max_steps": 6},
        mlflow={"enabled": True, "experiment": "flights", "system_metrics": False},
    )
    env = {"GPUYARD_JOB_ID": "job-7", "GPUYARD_ATTEMPT_ID": "att-1", "MLFLOW_TRACKING_URI": url}
    assert run_workers(config, 1, work, env=env | team.env()) == [exit_codes.SUCCESS]

    experiment = client.get_experiment_by_name("flights")
    assert experiment is not None and experiment.artifact_location.startswith("mlflow-artifacts:")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags[JOB_TAG] == "job-7"
    assert run.info.user_id == team.username  # the job signed in as its team's user
    assert client.search_model_versions("name='flight-delay'") == []  # the job wrote no registry
    found = f"source_run_id = '{run.info.run_id}'"
    (logged,) = client.search_logged_models([experiment_id], filter_string=found)
    import mlflow

    mlflow.set_tracking_uri(url)
    version = mlflow.register_model(f"models:/{logged.model_id}", "flight-delay")  # the pipeline does
    assert version.run_id == run.info.run_id
    with psycopg.connect(users) as conn:  # the user store is PostgreSQL's
        names = {row[0] for row in conn.execute("SELECT username FROM users")}
    assert names == {mlflow_access.ADMIN, pipeline.username, team.username}
    stored = [p for p in object_store.rglob("*") if p.is_file()]
    assert any(p.name == "MLmodel" for p in stored), stored  # in the server's store, not the worker's
    assert not (work / "mlartifacts").exists() and not (work / "mlflow.db").exists()
