"""A job's links on the page: the Airflow task that submitted it, and its MLflow run."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuyard_provider.ui import mlflow_links
from gpuyard_provider.ui.app import job_links


def _job(labels: dict[str, str], env: dict[str, str] | None = None) -> dict[str, object]:
    return {"id": "job-1", "spec": {"labels": labels, "env": env or {}}}


def test_the_airflow_task_link_comes_from_the_job_s_labels() -> None:
    labels = {
        "airflow.dag_id": "flights",
        "airflow.run_id": "manual__2026-12-01T10:00:00+00:00",
        "airflow.task_id": "train",
        "airflow.map_index": "-1",
    }
    assert job_links(_job(labels), "", None) == {
        "Airflow task": "/dags/flights/runs/manual__2026-12-01T10%3A00%3A00%2B00%3A00/tasks/train"
    }
    mapped = job_links(_job(labels | {"airflow.map_index": "3"}), "http://af:8080/", None)
    assert mapped["Airflow task"].startswith("http://af:8080/dags/flights/") and mapped[
        "Airflow task"
    ].endswith("/tasks/train/mapped/3")
    assert job_links(_job({"team": "a"}), "", None) == {}  # not submitted by Airflow


@pytest.mark.slow  # MLflow creates its SQLite store (about 30 s here)
def test_the_mlflow_link_finds_the_run_tagged_with_the_job(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow = MlflowClient(tracking_uri=tracking)
    experiment = mlflow.create_experiment("flights", artifact_location=(tmp_path / "artifacts").as_uri())
    run = mlflow.create_run(experiment, tags={"gpuyard.job_id": "job-1"})
    env = {"MLFLOW_TRACKING_URI": tracking}
    links = job_links(_job({}, env), "", "http://127.0.0.1:5000")
    assert links == {"MLflow run": f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run.info.run_id}"}
    assert job_links(_job({}, env), "", None) == {}  # no MLflow UI configured: no link
    other = {"id": "job-2", "spec": {"labels": {}, "env": env}}
    assert job_links(other, "", "http://127.0.0.1:5000") == {}  # no run of that job
    away = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9/"}  # nothing listens (MLflow retries for minutes)
    assert job_links(_job({}, away), "", "http://127.0.0.1:5000") == {}
    # the page had its answer while MLflow's lookup still runs in its thread: it waited WAIT_S, not
    # for MLflow
    assert ("http://127.0.0.1:9/", "job-1") in mlflow_links._asking
