"""MLflow objects created once, whoever creates them.

The pipeline's `start` (pipelines/lineage.py) and the training runtime (training/mlflow_tracking.py)
each create their experiment on first use; a promotion creates its model in the other registry
(pipelines/promotion.py), the pipeline's grant step its model (pipelines/mlflow_access.py). Two DAG
runs of one pipeline, or two first attempts, may do so at once: the store refuses the second create
(RESOURCE_ALREADY_EXISTS), and its caller goes on with what the first made.
"""

from __future__ import annotations

from typing import Any


def already_exists(error: Exception) -> bool:
    """Whether `error` is the store's refusal to create what exists already."""
    return getattr(error, "error_code", None) == "RESOURCE_ALREADY_EXISTS"


def create_experiment_once(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of the experiment `name` that `client` (an MlflowClient) created, or that another
    creator made since the caller found none."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.create_experiment(name, artifact_location=artifact_location))
    except MlflowException as error:
        found = client.get_experiment_by_name(name) if already_exists(error) else None
        if found is None:
            raise
        return str(found.experiment_id)
