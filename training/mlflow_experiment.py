"""An MLflow experiment created once, whoever creates it.

The pipeline's `start` (pipelines/lineage.py) and the training runtime (training/mlflow_tracking.py)
each create their experiment on first use. Two DAG runs of one pipeline, or two first attempts,
may look it up at once, both find none and both create it: the store refuses the second
(RESOURCE_ALREADY_EXISTS), whose caller then takes the experiment the first made.
"""

from __future__ import annotations

from typing import Any


def create_experiment_once(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of the experiment `name` that `client` (an MlflowClient) created, or that another
    creator made since the caller found none."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.create_experiment(name, artifact_location=artifact_location))
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)
