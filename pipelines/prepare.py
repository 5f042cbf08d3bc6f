"""Preparation step: runs the Spark jobs (flights, weather, planes) for a date range.

In-process by default (a local SparkSession, ``spark.master`` from the pipeline definition); or as
``spark-submit`` commands against any master (:func:`spark_submit_commands`, for an Airflow
SparkSubmitOperator or a shell). Re-running a date replaces that date's partitions.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shlex
from pathlib import Path

from pipelines import storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, MissingDataError

log = logging.getLogger(__name__)

JOBS_DIR = Path(__file__).resolve().parent.parent / "spark_jobs"
JOBS = ("prepare_flights", "prepare_weather", "prepare_planes")


def _urls(config: PipelineConfig) -> tuple[str, str]:
    raw = storage.spark_path(storage.join(config.data_root, "raw"))
    prepared = storage.spark_path(storage.join(config.data_root, "prepared"))
    return raw, prepared


def job_arguments(config: PipelineConfig, job: str, start: dt.date | str, end: dt.date | str) -> list[str]:
    """The ``main(argv)`` arguments of ``job`` for ``start..end`` (dates, or strings such as Airflow
    templates that render to YYYY-MM-DD)."""
    if job not in JOBS:
        raise ConfigError(f"unknown Spark job {job!r}; expected one of {JOBS}")
    raw, prepared = _urls(config)
    args = [
        "--run-date",
        str(start),
        "--end-date",
        str(end),
        "--input",
        raw,
        "--output",
        prepared,
        "--shuffle-partitions",
        str(config.spark_shuffle_partitions),
    ]
    if job == "prepare_flights":
        args += [
            "--carrier-window-hours",
            str(config.carrier_window_hours),
            "--route-window-hours",
            str(config.route_window_hours),
            "--carrier-step-hours",
            str(config.carrier_refresh_hours),
            "--route-step-hours",
            str(config.route_refresh_hours),
            "--late-minutes",
            str(config.late_threshold_minutes),
            "--timezone-overrides",
            json.dumps(dict(config.timezone_overrides), sort_keys=True),
        ]
    return args


def spark_submit_commands(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    master: str | None = None,
) -> list[str]:
    """Shell commands that run the preparation through ``spark-submit`` (``--master`` from the config)."""
    start, end = start or config.start_date, end or config.end_date
    master = master or config.spark_master
    return [
        shlex.join(
            [
                "spark-submit",
                "--master",
                master,
                "--conf",
                "spark.sql.session.timeZone=UTC",
                str(JOBS_DIR / f"{job}.py"),
                *job_arguments(config, job, start, end),
            ]
        )
        for job in JOBS
    ]


def prepare(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    master: str | None = None,
) -> dict[str, str]:
    """The Airflow-callable step: run the three jobs in one local SparkSession. Returns table -> URL."""
    from spark_jobs import common, prepare_flights, prepare_planes, prepare_weather

    start, end = start or config.start_date, end or config.end_date
    raw_flights = storage.join(config.data_root, "raw", "flights")
    storage.require_partitions(raw_flights, storage_dates(start, end), "raw.flights")
    raw, prepared = _urls(config)
    spark = common.build_session(
        "gpuyard-prepare", master or config.spark_master, config.spark_shuffle_partitions
    )
    params = prepare_flights.FlightJobParams(
        carrier_window_hours=config.carrier_window_hours,
        route_window_hours=config.route_window_hours,
        carrier_step_hours=config.carrier_refresh_hours,
        route_step_hours=config.route_refresh_hours,
        late_minutes=config.late_threshold_minutes,
        timezone_overrides=dict(config.timezone_overrides),
    )
    try:
        prepare_flights.run(spark, raw, prepared, start, end, params)
        prepare_weather.run(spark, raw, prepared, start, end, dict(config.timezone_overrides))
        prepare_planes.run(spark, raw, prepared, start, end)
    except common.JobInputError as exc:
        raise MissingDataError(str(exc)) from exc
    tables = (*prepare_flights.OUTPUT_TABLES, "origin_weather", "plane_attributes")
    return {t: storage.join(config.data_root, "prepared", t) for t in tables}


def storage_dates(start: dt.date, end: dt.date) -> list[dt.date]:
    return [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]
