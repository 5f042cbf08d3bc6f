"""OpenLineage facets and dataset names of gpuyard's tasks: pure data, no I/O.

Imported only when Airflow's OpenLineage listener asks a task for its lineage (a deployment that
configured a transport): it imports openlineage.client, which no task or DAG parse pays for
otherwise. Names follow OpenLineage's dataset naming: a local file is namespace `file` and its
path, an object store `s3://<bucket>` (`gs://`, ...) and its key; an MLflow model is namespace the
tracking URI and name `models/<model>/<version>` (a logged model `models/<model id>`, a run's
artifact `runs/<run id>/<path>`), read off its `models:/`/`runs:/` URI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

import attr
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import RunFacet
from openlineage.client.generated.base_subset_dataset import (
    InputSubsetInputDatasetFacet,
    OutputSubsetOutputDatasetFacet,
    Partition,
    PartitionSubsetCondition,
)

# The facet's JSON schema is GpuyardJobRunFacet.json, shipped beside this module. No public address
# serves it yet, so `_schemaURL` names it by the distribution and file (a URN: a URI, as the spec asks).
SCHEMA_URL = "urn:airflow-provider-gpuyard:1.0.0:GpuyardJobRunFacet.json#/$defs/GpuyardJobRunFacet"
PARTITION = "date"  # the dimension of a dated table's partitions (pipelines/storage.py: date=YYYY-MM-DD)


@attr.define
class GpuyardJobRunFacet(RunFacet):
    """The gpuyard training job a task run followed (`gpuyard_job` in the run's facets)."""

    jobId: str
    state: str | None = None
    attempts: int | None = None
    preemptions: int | None = None
    lostSteps: int | None = None
    mlflowRunId: str | None = None

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def storage_name(url: str) -> tuple[str, str]:
    """(namespace, name) of a data URL: `file` and the path for a local one, `<scheme>://<bucket>`
    and the key for an object store."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file", "local"):
        return "file", parsed.path if parsed.scheme else url
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")


def mlflow_name(tracking_uri: str, uri: str) -> tuple[str, str]:
    """(namespace, name) of an MLflow model or artifact URI: `models:/flights-delay/3` ->
    (tracking URI, `models/flights-delay/3`); a user and password in the tracking URI are left out."""
    parsed = urlparse(tracking_uri)
    if parsed.password or parsed.username:
        tracking_uri = parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()
    scheme, _, rest = uri.partition(":")
    return tracking_uri, f"{scheme}/{rest.strip('/')}"


def _partitions(days: Sequence[str]) -> PartitionSubsetCondition:
    return PartitionSubsetCondition(
        partitions=[Partition(dimensions={PARTITION: day}, identifier=f"{PARTITION}={day}") for day in days]
    )


def read(namespace: str, name: str, days: Sequence[str] = ()) -> InputDataset:
    """An input dataset, with the partitions read (days) where it is dated."""
    facets = {"subset": InputSubsetInputDatasetFacet(inputCondition=_partitions(days))} if days else {}
    return InputDataset(namespace=namespace, name=name, inputFacets=facets)


def wrote(namespace: str, name: str, days: Sequence[str] = ()) -> OutputDataset:
    """An output dataset, with the partitions written (days) where it is dated."""
    facets = {"subset": OutputSubsetOutputDatasetFacet(outputCondition=_partitions(days))} if days else {}
    return OutputDataset(namespace=namespace, name=name, outputFacets=facets)


def job_facet(result: Mapping[str, Any]) -> GpuyardJobRunFacet:
    """The facet of a job's outcome (GpuTrainingOperator's return value; a verdict's `job_id`)."""
    return GpuyardJobRunFacet(
        jobId=str(result["job_id"]),
        state=result.get("state"),
        attempts=result.get("attempts"),
        preemptions=result.get("preemptions"),
        lostSteps=result.get("lost_steps"),
        mlflowRunId=result.get("mlflow_run_id"),
    )


def operator_lineage(
    inputs: Iterable[InputDataset] = (),
    outputs: Iterable[OutputDataset] = (),
    job: GpuyardJobRunFacet | None = None,
) -> Any:
    """What a task's `get_openlineage_facets_on_complete` returns (the provider's OperatorLineage)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=list(inputs), outputs=list(outputs), run_facets={"gpuyard_job": job} if job else {}
    )
