"""One training run is one MLflow run, however many attempts it takes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from trainkit import launch, read_events, run_workers, write_config

from training import exit_codes
from training.checkpoint import CheckpointStore
from training.config import MlflowConfig
from training.mlflow_create import create_experiment_once
from training.mlflow_tracking import ATTEMPTS_TAG, JOB_TAG, LOST_TAG, STEP_METRIC, MlflowTracker

pytestmark = pytest.mark.slow


def test_attempts_of_one_job_share_one_run_found_by_job_tag(tmp_path: Path) -> None:
    """An attempt lost before its first checkpoint has no manifest to carry the run id: the next attempt
    finds the run by its gpuyard.job_id tag and counts the lost steps."""
    cfg = MlflowConfig(tracking_uri=f"sqlite:///{tmp_path}/m.db", experiment="e", system_metrics=False)
    first = MlflowTracker(cfg, str(tmp_path), "job-7", "att-1")
    run_id = first.start(None, 0)
    for step in range(1, 6):
        first.log_metrics({STEP_METRIC: 1.0 / step}, step)
    first.end("KILLED")
    second = MlflowTracker(cfg, str(tmp_path), "job-7", "att-2")
    assert second.start(None, 0) == run_id
    second.end("FINISHED")
    other = MlflowTracker(cfg, str(tmp_path), "job-8", "att-1")
    assert other.start(None, 0) != run_id  # another job, another run
    other.end("FINISHED")
    tags = second.client.get_run(run_id).data.tags
    assert tags[ATTEMPTS_TAG] == "2" and tags[LOST_TAG] == "5"
    assert tags["gpuyard.attempt_ids"] == "att-1,att-2"
    assert not (tmp_path / "mlruns").exists() and not Path("mlruns").exists()


def test_a_creator_that_lost_the_race_for_the_experiment_takes_the_winners(tmp_path: Path) -> None:
    """Two DAG runs of one pipeline start together: both find no experiment and both create it. The
    second create, after the first, is answered with the first's experiment (CI, stop 57: the
    loser's `start` failed on the store's unique name, and its DAG run with it)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    assert client.get_experiment_by_name("flights_delay") is None  # both creators looked: none
    first = create_experiment_once(client, "flights_delay", None)
    assert create_experiment_once(client, "flights_delay", None) == first
    assert [e.name for e in client.search_experiments()].count("flights_delay") == 1
    with pytest.raises(MlflowException, match="name"):  # any other refusal still fails the caller
        create_experiment_once(client, "", None)


def test_lost_node_then_resume_continues_the_same_mlflow_run(tmp_path: Path, flights_parquet: Path) -> None:
    cfg, work = write_config(
        tmp_path,
        flights_parquet,
        train={"max_steps": 12, "step_sleep_s": 0.2},
        checkpoint={"interval_steps": 4},
        mlflow={
            "enabled": True,
            "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
            "experiment": "flights",
            "register_model": "flight-delay",
            "system_metrics": True,
            "system_metrics_interval_s": 0.5,
        },
    )
    env = {"GPUYARD_JOB_ID": "job-42", "GPUYARD_ATTEMPT_ID": "att-1"}
    first = launch(cfg, 1, work, env=env)
    first.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 6 for e in ev), timeout=120)
    first.signal(signal.SIGKILL)  # the node is gone: no checkpoint on the way out
    assert first.wait() == [-signal.SIGKILL]
    manifest = CheckpointStore((work / "checkpoints").as_uri()).latest()
    assert manifest is not None and manifest.step == 4
    run_id = manifest.run["mlflow_run_id"]
    assert run_id and manifest.run["job_id"] == "job-42"

    env2 = {**env, "GPUYARD_ATTEMPT_ID": "att-2"}
    assert run_workers(cfg, 1, work, env=env2, overrides=["train.step_sleep_s=0"]) == [exit_codes.SUCCESS]
    assert next(e for e in read_events(work) if e["event"] == "resume")["step"] == 4

    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("flights")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # one training run, one MLflow run
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[JOB_TAG] == "job-42" and run.data.tags[ATTEMPTS_TAG] == "2"
    assert int(run.data.tags[LOST_TAG]) >= 2  # steps 5 and 6 at least were redone
    assert run.data.params["train.max_steps"] == "12" and run.data.params["strategy"] == "ddp"
    steps = {m.step for m in client.get_metric_history(run_id, STEP_METRIC)}
    assert steps == set(range(1, 13))
    assert "val_loss" in run.data.metrics
    assert any(k.startswith("system/") for k in run.data.metrics), sorted(run.data.metrics)
    assert experiment.artifact_location.startswith((work / "mlartifacts").resolve().as_uri())

    versions = client.search_model_versions("name='flight-delay'")
    assert len(versions) == 1 and versions[0].run_id == run_id
    import mlflow.pyfunc
    import numpy as np

    model = mlflow.pyfunc.load_model(f"models:/flight-delay/{versions[0].version}")
    assert model.metadata.signature is not None
    probabilities = model.predict(np.zeros((3, 6), dtype=np.float32))
    assert np.all((probabilities >= 0) & (probabilities <= 1))
