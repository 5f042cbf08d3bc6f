"""What each pipeline step tells OpenLineage it read and wrote: raw partitions -> prepared tables ->
training set -> (the training jobs, gpuyard_provider) -> model versions.

A step hands the listener its lineage with `attach` as it ends; the listener asks for it only where
a deployment configured OpenLineage (docs/airflow.md), and only then are these built and
openlineage.client imported (gpuyard_provider/openlineage.py). Names: the data root's tables as
`file` + path (or `s3://<bucket>` + key), dated ones with the days read or written as partitions
(which tables a step reads and writes: the pipeline's data source, pipelines/sources.py);
MLflow models as the tracking URI + `models/<model>/<version>`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipelines import storage
from pipelines.definition import PipelineDefinition


def attach(task: Any, build: Callable[..., Any], *args: Any) -> None:
    """Give `task` (the running operator) its lineage for OpenLineage's listener: `build(*args)`,
    called by the listener once the task succeeded (the provider's `get_openlineage_facets_on_complete`)."""
    task.get_openlineage_facets_on_complete = lambda task_instance: build(*args)


def days(first: str | dt.date, last: str | dt.date) -> list[str]:
    start, end = dt.date.fromisoformat(str(first)), dt.date.fromisoformat(str(last))
    return [str(start + dt.timedelta(days=n)) for n in range((end - start).days + 1)]


def _raw(definition: PipelineDefinition, table: str) -> tuple[str, str]:
    from gpuyard_provider import openlineage as ol

    return ol.storage_name(storage.join(definition.data.root, "raw", table))


def _prepared(definition: PipelineDefinition, table: str) -> tuple[str, str]:
    from gpuyard_provider import openlineage as ol

    return ol.storage_name(storage.join(definition.data.root, "prepared", table))


def ingest(definition: PipelineDefinition, landed: Iterable[str]) -> Any:
    """The raw tables landed: the dated ones with the days written (the run's partition the last)."""
    from gpuyard_provider import openlineage as ol

    source, written = definition.source, sorted(landed)
    return ol.operator_lineage(
        outputs=[
            ol.wrote(*_raw(definition, t), written if t in source.dated else ())
            for t in (*source.dated, *source.reference)
        ]
    )


def prepare(definition: PipelineDefinition, read: Iterable[str], jobs: Iterable[str] | None = None) -> Any:
    """The raw tables the Spark jobs `jobs` read (dated ones: the days, the look-back first) and the
    prepared tables they wrote; without `jobs`, the pandas engine's, which computes what every Spark
    job does (a source without Spark jobs: from all its raw tables, all its prepared ones)."""
    from gpuyard_provider import openlineage as ol

    source = definition.source
    chosen = list(source.spark_jobs) if jobs is None else [source.job(job) for job in jobs]
    raw = sorted({t for job in chosen for t in job.reads} or {*source.dated, *source.reference})
    prepared = [t for job in chosen for t in job.writes] or list(source.prepared)
    read_days = list(read)
    return ol.operator_lineage(
        inputs=[ol.read(*_raw(definition, t), read_days if t in source.dated else ()) for t in raw],
        outputs=[ol.wrote(*_prepared(definition, t)) for t in prepared],
    )


def spark_job(path: str, job: str, task_instance: Any) -> Any:
    """A Spark job's lineage, from the run's window (`start`'s XCom) as the listener asks for it."""
    from pipelines import prepare as prepare_step
    from pipelines.definition import load_definition

    definition = load_definition(path)
    window = task_instance.xcom_pull(task_ids="start")
    config = definition.step_config(definition.window(window["run_date"]))
    first, last = prepare_step.read_days(config, config.start_date, config.end_date)
    return prepare(definition, days(first, last), [job])


def training_set(definition: PipelineDefinition, built: Mapping[str, Mapping[str, Any]]) -> Any:
    """The prepared tables the point-in-time join read (Feast's sources) and the sets it wrote."""
    from gpuyard_provider import openlineage as ol

    return ol.operator_lineage(
        inputs=[ol.read(*_prepared(definition, t)) for t in definition.source.prepared],
        outputs=[ol.wrote(*ol.storage_name(built[part]["data_url"])) for part in ("train", "holdout")],
    )


def pick_best(
    definition: PipelineDefinition, results: Iterable[Mapping[str, Any]], registered: Iterable[str]
) -> Any:
    """The models the training jobs logged, and the versions registered from them."""
    from gpuyard_provider import openlineage as ol

    uri = definition.tracking_uri
    return ol.operator_lineage(
        inputs=[ol.read(*ol.mlflow_name(uri, r["model_uri"])) for r in results if r.get("model_uri")],
        outputs=[ol.wrote(*ol.mlflow_name(uri, version)) for version in registered],
    )


def _version(definition: PipelineDefinition, version: str) -> str:
    return f"models:/{definition.promotion.model}/{version}"


def evaluate(definition: PipelineDefinition, verdict: Mapping[str, Any], holdout_url: str) -> Any:
    """The candidate (and the champion) scored on the held-out set."""
    from gpuyard_provider import openlineage as ol

    scored = [verdict["candidate"], *([verdict["champion"]] if verdict.get("champion") else [])]
    versions = [
        ol.read(*ol.mlflow_name(definition.tracking_uri, _version(definition, s["version"]))) for s in scored
    ]
    return ol.operator_lineage(
        inputs=[*versions, ol.read(*ol.storage_name(holdout_url))], job=ol.job_facet(verdict)
    )


def publish(definition: PipelineDefinition, verdict: Mapping[str, Any], outcome: Mapping[str, Any]) -> Any:
    """The model version published (its alias moved), with the gpuyard job that trained it."""
    from gpuyard_provider import openlineage as ol

    version = ol.mlflow_name(definition.tracking_uri, _version(definition, str(outcome["version"])))
    return ol.operator_lineage(
        inputs=[ol.read(*version)], outputs=[ol.wrote(*version)], job=ol.job_facet(verdict)
    )
