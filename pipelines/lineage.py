"""Lineage in MLflow: one run per DAG run, the training runs its children, the model versions tagged.

The DAG run's MLflow run holds what the run was: dag id, run id, logical date, the git commit of
the code, the sha256 of the pipeline definition, the run's Params, and the evaluation. Each
training job's run is its child (`mlflow.parentRunId`, set by the training runtime from
MLFLOW_PARENT_RUN_ID), tagged here with the gpuyard job, its attempts, preemptions and lost
progress, the training set's manifest hash and the feature service with its version, and given the
training set as its input dataset (MLflow's dataset API: the run page's Datasets). A registered
model version carries the ids of both runs, so a person walks from a version to all of them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from typing import Any

from pipelines import storage
from pipelines.definition import REPOSITORY, PipelineDefinition
from pipelines.errors import ConfigError
from training.mlflow_create import create_experiment_once

PARENT_TAG = "mlflow.parentRunId"
WINDOW_TAG = "pipeline.window"  # the days the DAG run's first `start` chose (JSON)


def client(definition: PipelineDefinition, registry_uri: str | None = None) -> Any:
    """The pipeline's MLflow client; with `registry_uri`, reaching that registry (another
    environment's: pipelines/promotion.py) instead of the pipeline's own."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=definition.tracking_uri, registry_uri=registry_uri)


def experiment_id(definition: PipelineDefinition) -> str:
    """The pipeline's experiment, created with its artifacts under the data root (never ./mlruns), or
    where its tracking server places them."""
    mlflow = client(definition)
    found = mlflow.get_experiment_by_name(definition.experiment)
    if found is None:
        return create_experiment_once(mlflow, definition.experiment, definition.artifact_location)
    if definition.artifact_location is None and storage.is_local(found.artifact_location):
        # made on a file store: the training jobs would write these files themselves, as their users
        raise ConfigError(
            f"experiment {definition.experiment!r} at {definition.tracking_uri} keeps its artifacts in "
            f"{found.artifact_location}, which only a file store's clients write; remove it (or the store, "
            f"made before the tracking server) or name another experiment in the definition's mlflow section"
        )
    return str(found.experiment_id)


def git_commit() -> str:
    """The repository's commit, with `-dirty` when files differ from it (reproducibility)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def start_run(
    definition: PipelineDefinition,
    *,
    dag_id: str,
    run_id: str,
    logical_date: str | None,
    params: Mapping[str, Any],
    window: Mapping[str, Any],
) -> dict[str, Any]:
    """The DAG run's MLflow run, open (RUNNING), with the window and commit its first start recorded.

    Airflow runs `start` again on a retry and whenever a task of the run is cleared (a setup is
    cleared with its work), so the run is found again by its tags and keeps what it began with:
    the same MLflow run, the same days, the same code version. Returns the window's fields with
    `mlflow_run_id` and `git_commit`.
    """
    mlflow = client(definition)
    experiment = experiment_id(definition)
    found = mlflow.search_runs(
        [experiment],
        filter_string=f"tags.`airflow.dag_id` = '{dag_id}' and tags.`airflow.run_id` = '{run_id}'",
        max_results=1,
    )
    if found and WINDOW_TAG in found[0].data.tags:
        run = found[0]
        mlflow.update_run(run.info.run_id, status="RUNNING")  # a cleared task reopens a closed run
        first = json.loads(run.data.tags[WINDOW_TAG])
        return {**first, "mlflow_run_id": run.info.run_id, "git_commit": run.data.tags["git.commit"]}
    commit = git_commit()
    run_id_mlflow = found[0].info.run_id if found else None  # a start cut off before its window
    if run_id_mlflow is None:
        run_id_mlflow = mlflow.create_run(
            experiment,
            run_name=f"{dag_id} {run_id}",
            tags={
                "airflow.dag_id": dag_id,
                "airflow.run_id": run_id,
                "airflow.logical_date": logical_date or "",
                "pipeline.name": definition.name,
                "pipeline.definition_sha256": definition.digest,
                "pipeline.definition": str(definition.path.relative_to(REPOSITORY))
                if definition.path.is_relative_to(REPOSITORY)
                else str(definition.path),
            },
        ).info.run_id
    for key, value in {**params, **{f"window.{k}": v for k, v in window.items()}}.items():
        mlflow.log_param(run_id_mlflow, key, _text(value))  # the same value again is no error
    mlflow.set_tag(run_id_mlflow, "git.commit", commit)
    mlflow.set_tag(run_id_mlflow, WINDOW_TAG, _text(dict(window)))  # last: the run is complete
    return {**window, "mlflow_run_id": run_id_mlflow, "git_commit": commit}


def manifest_digest(manifest_url: str) -> str:
    fs, path = storage.filesystem(manifest_url)
    with fs.open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def tag_training_run(
    definition: PipelineDefinition, run_id: str, result: Mapping[str, Any], training_set: Mapping[str, Any]
) -> None:
    """The training run's lineage: its gpuyard job and the data it learned from."""
    service = training_set["feature_service"]
    tags = {
        "gpuyard.job_id": result["job_id"],
        "gpuyard.attempts": str(result["attempts"]),
        "gpuyard.preemptions": str(result["preemptions"]),
        "gpuyard.progress_lost_steps_total": str(result["lost_steps"]),
        "training_set.manifest": training_set["manifest_url"],
        "training_set.manifest_sha256": training_set["manifest_sha256"],
        "training_set.data_snapshot_id": training_set["data_snapshot_id"],
        "feature_service.name": service["name"],
        "feature_service.version": service["version"],
        "feature_service.fingerprint": service["fingerprint"],
    }
    mlflow = client(definition)
    for key, value in tags.items():
        mlflow.set_tag(run_id, key, value)
    mlflow.log_inputs(run_id, datasets=[training_input(definition, training_set)])  # again: no second input


def training_input(definition: PipelineDefinition, training_set: Mapping[str, Any]) -> Any:
    """The training set as the run's MLflow input dataset (context `training`): its data file as the
    source, the manifest's sha256 as the digest; nothing of it is read."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    with warnings.catch_warnings():  # a file:// URL matches two equal local sources: MLflow takes either
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(training_set["data_url"])
    dataset = MetaDataset(
        source, name=f"{definition.name}/training_set", digest=training_set["manifest_sha256"][:36]
    )
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, "training")])


def register(definition: PipelineDefinition, run_id: str, model_uri: str) -> str:
    """`models:/<model>/<version>` of the run's model in the definition's registered model: the
    version registered before for this run (a retry), else a new one."""
    import mlflow

    name = definition.promotion.model
    if model_uri.startswith(f"models:/{name}/"):
        return model_uri  # registered already
    found = [v for v in client(definition).search_model_versions(f"run_id = '{run_id}'") if v.name == name]
    if found:
        return f"models:/{name}/{max(int(v.version) for v in found)}"
    mlflow.set_tracking_uri(definition.tracking_uri)
    version = mlflow.register_model(model_uri, name)
    return f"models:/{name}/{version.version}"


def tag_version(definition: PipelineDefinition, version: str, tags: Mapping[str, Any]) -> None:
    mlflow = client(definition)
    for key, value in tags.items():
        mlflow.set_model_version_tag(definition.promotion.model, version, key, _text(value))


def log_to_run(
    run_id: str, definition: PipelineDefinition, metrics: Mapping[str, float], **tags: Any
) -> None:
    mlflow = client(definition)
    for key, value in metrics.items():
        mlflow.log_metric(run_id, key, float(value))
    for key, value in tags.items():
        mlflow.set_tag(run_id, key, _text(value))


def end_run(definition: PipelineDefinition, run_id: str, status: str) -> None:
    client(definition).set_terminated(run_id, status=status)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
