"""GpuTrainingOperator and GpuJobTrigger in a real Airflow (api-server, scheduler, dag-processor,
triggerer, LocalExecutor) against a real embedded gpuyard running real training processes.

Each crash is forced at a chosen point, never timed: the gate in front of the gpuyard API holds
one answer (the request reached the API and committed), the test SIGKILLs the process that asked,
then lets the answer go to nobody. The DAGs are tests/airflow/dags/gpuyard_cases.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pandas as pd
import pytest
import yaml
from airflow_harness import ROOT
from gpuyard.airflow.narration import Story
from servers import wait_until
from stack import AirflowStack, Gate, Gpuyard

pytestmark = pytest.mark.slow

DONE = {"success", "failed", "upstream_failed"}


@dataclass
class World:
    gpuyard: Gpuyard
    gate: Gate
    airflow: AirflowStack
    mlflow_uri: str

    def store_rows(self, dag_id: str) -> list[tuple[str, str]]:
        """The task state store of a DAG's runs, read from Airflow's database."""
        with sqlite3.connect(self.airflow.home / "airflow.db") as conn:
            return conn.execute(
                "SELECT key, value FROM task_state_store WHERE dag_id = ?", (dag_id,)
            ).fetchall()


def tiny_training_set(folder: Path) -> Path:
    rng = np.random.default_rng(7)
    features = rng.normal(size=(512, 4))
    frame = pd.DataFrame(features, columns=[f"x{i}" for i in range(4)])
    frame["label"] = (features[:, 0] + 0.5 * features[:, 1] > 0).astype("int64")
    path = folder / "train.parquet"
    frame.to_parquet(path)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("stack")
    config = root / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "seed": 7,
                "workdir": str(root / "work"),
                "data": {"path": str(tiny_training_set(root)), "label_column": "label", "val_fraction": 0.2},
                "model": {"hidden": [8], "dropout": 0.0},
                "train": {"max_steps": 10, "global_batch_size": 32, "lr": 0.01, "log_every": 5},
                "parallel": {"strategy": "ddp"},
                "checkpoint": {"interval_steps": 5, "keep_last": 2},
                "heartbeat": {"interval_s": 2.0},
                "mlflow": {"experiment": "gpuyard-cases", "log_model": False, "system_metrics": False},
            }
        )
    )
    mlflow_uri = f"sqlite:///{root / 'mlflow.db'}"
    from mlflow.tracking import MlflowClient

    MlflowClient(mlflow_uri).search_experiments()  # creates the schema once, before jobs race to
    gpuyard = Gpuyard(root / "gpuyard").start()
    gate = Gate(gpuyard.url)
    connection = {"conn_type": "gpuyard", "host": gate.url, "password": gpuyard.token}
    airflow = AirflowStack(
        root / "airflow",
        ROOT / "tests" / "airflow" / "dags",
        GPUYARD_CASES_CONFIG=str(config),
        GPUYARD_CASES_CHECKPOINTS=(root / "checkpoints").as_uri(),
        GPUYARD_CASES_MLFLOW=mlflow_uri,
        AIRFLOW_CONN_GPUYARD_DEFAULT=json.dumps(connection),
        AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="5",
    )
    (root / "airflow").mkdir()
    try:
        airflow.start()
        for case in ("kill_before_store", "kill_while_following", "triggerer_restart", "mark_failed"):
            airflow.wait_for_dag(f"case_{case}")
        yield World(gpuyard, gate, airflow, mlflow_uri)
    finally:
        airflow.stop()
        gate.stop()
        gpuyard.stop()


def job_of(path: str) -> str:
    return parse_qs(urlparse(path).query).get("job", [""])[0]


def test_sigkill_between_submit_and_storing_the_id_reattaches_by_the_key(world: World) -> None:
    dag = "case_kill_before_store"
    hold = world.gate.hold(lambda m, p, b: m == "POST" and p == "/v1/jobs" and b'"kill-before-store"' in b)
    run = world.airflow.trigger(dag)
    assert hold.arrived.wait(240), "the task never submitted"
    assert len(world.gpuyard.jobs("kill-before-store")) == 1  # committed: the API made the job
    assert world.store_rows(dag) == []  # ... and the task never learned its id
    os.kill(hold.client_pid(), signal.SIGKILL)
    hold.release()

    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    [job] = world.gpuyard.jobs("kill-before-store")  # the retry's submit was answered with the same job
    assert job["state"] == "SUCCEEDED"
    [(key, value)] = world.store_rows(dag)
    assert key == "gpuyard_job" and json.loads(value)["job_id"] == job["id"]


def test_sigkill_while_following_reattaches_from_the_task_state_store(world: World) -> None:
    dag = "case_kill_while_following"

    def following(method: str, path: str, body: bytes) -> bool:
        job = job_of(path)
        return (
            method == "GET"
            and path.startswith("/v1/events")
            and bool(job)
            and (world.gpuyard.job(job)["name"] == "kill-while-following")
        )

    hold = world.gate.hold(following)
    run = world.airflow.trigger(dag)
    assert hold.arrived.wait(240), "the task never followed its job"
    [(_, value)] = world.store_rows(dag)  # stored before following
    job_id = json.loads(value)["job_id"]
    os.kill(hold.client_pid(), signal.SIGKILL)
    hold.release()

    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    assert [j["id"] for j in world.gpuyard.jobs("kill-while-following")] == [job_id]
    logs = world.airflow.logs(dag, run, "train")
    assert "Reconnecting to existing job" in logs["attempt=2.log"]
    assert f"gpuyard job {job_id} SUCCEEDED" in logs["attempt=2.log"]


NARRATED = re.compile(r"gpuyard job (job-[0-9a-f]+) #(\d+): ")


def narrated_seqs(logs: dict[str, str]) -> list[int]:
    seqs = []
    for name, text in logs.items():
        if ".trigger." not in name:
            continue
        for line in text.splitlines():
            match = NARRATED.search(json.loads(line).get("event", ""))
            if match:
                seqs.append(int(match.group(2)))
    return seqs


def test_the_trigger_survives_a_triggerer_restart_without_missing_or_repeating(world: World) -> None:
    dag, name = "case_triggerer_restart", "triggerer-restart"
    run = world.airflow.trigger(dag)
    wait_until(
        lambda: any(
            "running" in t for n, t in world.airflow.logs(dag, run, "train").items() if ".trigger." in n
        ),
        240,
        0.5,
        what="the trigger to tell the attempt running",
    )
    world.airflow.kill_component("triggerer")
    [job] = world.gpuyard.jobs(name)
    wait_until(lambda: world.gpuyard.job(job["id"])["state"] == "SUCCEEDED", 180, 0.5, what="the job to end")
    world.airflow.start_component("triggerer")  # the job ended while no triggerer ran

    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert ti["state"] == "success"
    told = narrated_seqs(world.airflow.logs(dag, run, "train"))
    detail = world.gpuyard.job(job["id"])
    story = Story()
    expected = [e["seq"] for e in detail["events"] if story.tell({**e, "job_id": job["id"]}, detail)]
    assert sorted(told) == expected  # every change told, none twice, across the two triggerers
    assert len(set(told)) == len(told)


def test_the_connection_token_appears_in_no_log_xcom_rendered_field_or_mlflow(world: World) -> None:
    token = world.gpuyard.token
    leaks = [str(path) for path, text in world.airflow.all_logs() if token in text]
    assert leaks == []
    with sqlite3.connect(world.airflow.home / "airflow.db") as conn:
        xcoms = conn.execute("SELECT dag_id, key, value FROM xcom").fetchall()
        rendered = conn.execute("SELECT rendered_fields FROM rendered_task_instance_fields").fetchall()
    assert {key for _, key, _ in xcoms} >= {"gpuyard_job_id", "return_value", "mlflow_run_id", "model_uri"}
    assert rendered
    for row in [*xcoms, *rendered]:
        assert token not in json.dumps([str(v) for v in row])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(world.mlflow_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs  # the training runs logged their parameters
    for found in runs:
        assert token not in json.dumps({**found.data.params, **found.data.tags})
