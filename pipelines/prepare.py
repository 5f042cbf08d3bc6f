"""Preparation step: the flights, weather and planes jobs for a date range, on Spark or pandas.

Two engines compute the same tables row for row (tests/data/test_data_engines.py): ``spark``
(spark_jobs/, in a local SparkSession with ``spark.master`` from the definition, or as
``spark-submit`` commands against any master: :func:`spark_submit_commands`) and ``pandas``
(pipelines/prepare_pandas.py, one process, bounded by its memory). ``engine: auto`` picks by the
rows a run reads (the raw parquet footers): Spark from ``spark.spark_from_rows`` on, the crossover
``benchmarks/spark_prepare.py`` measured (docs/data.md). Re-running a date replaces that date's rows.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines import storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, MissingDataError
from spark_jobs import layout

if TYPE_CHECKING:
    from spark_jobs.prepare_flights import FlightJobParams

log = logging.getLogger(__name__)

JOBS_DIR = Path(__file__).resolve().parent.parent / "spark_jobs"
JOBS = ("prepare_flights", "prepare_weather", "prepare_planes")
OUTPUT_TABLES = ("labels", "flight_schedule", "carrier_delay_stats", "route_delay_stats")
ENGINES = ("auto", "spark", "pandas")


def choose_engine(engine: str, rows: int, spark_from_rows: int) -> str:
    """``spark`` or ``pandas``: the forced engine, or for ``auto`` Spark from ``spark_from_rows`` rows on."""
    if engine not in ENGINES:
        raise ConfigError(f"spark.engine: expected one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine
    return "spark" if rows >= spark_from_rows else "pandas"


def read_days(config: PipelineConfig, start: dt.date, end: dt.date) -> tuple[dt.date, dt.date]:
    """The raw days a preparation of ``start..end`` reads: the trailing windows' look-back first."""
    return start - dt.timedelta(days=flight_params(config).lookback_days), end


def expected_rows(config: PipelineConfig, start: dt.date, end: dt.date) -> int:
    """Raw flight rows a preparation of ``start..end`` reads, from the parquet footers (no data read)."""
    first, last = read_days(config, start, end)
    return storage.count_rows(storage.join(config.data_root, "raw", "flights"), first, last)


def resolve_engine(config: PipelineConfig, start: dt.date, end: dt.date) -> tuple[str, int]:
    """The engine a run of ``start..end`` uses and the rows that decided it."""
    rows = expected_rows(config, start, end) if config.engine == "auto" else 0
    engine = choose_engine(config.engine, rows, config.spark_from_rows)
    log.info(
        "prepare %s..%s: %s engine (%s, %d raw rows, Spark from %d)",
        start,
        end,
        engine,
        config.engine,
        rows,
        config.spark_from_rows,
    )
    return engine, rows


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


def flight_params(config: PipelineConfig) -> FlightJobParams:
    from spark_jobs.prepare_flights import FlightJobParams

    return FlightJobParams(
        carrier_window_hours=config.carrier_window_hours,
        route_window_hours=config.route_window_hours,
        carrier_step_hours=config.carrier_refresh_hours,
        route_step_hours=config.route_refresh_hours,
        late_minutes=config.late_threshold_minutes,
        timezone_overrides=dict(config.timezone_overrides),
    )


def _run_spark(config: PipelineConfig, start: dt.date, end: dt.date, master: str | None) -> None:
    from spark_jobs import common, prepare_flights, prepare_planes, prepare_weather

    raw, prepared = _urls(config)
    spark = common.build_session(
        "gpuyard-prepare", master or config.spark_master, config.spark_shuffle_partitions
    )
    try:
        job = common.JobRun(raw, prepared, start, end)
        prepare_flights.run(spark, job, flight_params(config))
        prepare_weather.run(spark, job, dict(config.timezone_overrides))
        prepare_planes.run(spark, job)
    except common.JobInputError as exc:
        raise MissingDataError(str(exc)) from exc


def _run_pandas(config: PipelineConfig, start: dt.date, end: dt.date, master: str | None) -> None:
    from pipelines import prepare_pandas

    raw = storage.join(config.data_root, "raw")
    prepared = storage.join(config.data_root, "prepared")
    prepare_pandas.run(raw, prepared, start, end, flight_params(config))


RUNNERS = {"spark": _run_spark, "pandas": _run_pandas}


def prepare(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    master: str | None = None,
    engine: str | None = None,
) -> dict[str, str]:
    """The Airflow-callable step: run the three jobs on ``engine`` (default: the config's, where
    ``auto`` picks by volume). Returns table -> URL."""
    start, end = start or config.start_date, end or config.end_date
    raw_flights = storage.join(config.data_root, "raw", "flights")
    storage.require_partitions(raw_flights, layout.days(start, end), "raw.flights")
    if engine is not None:
        config = config.replace(engine=engine)
    chosen, _ = resolve_engine(config, start, end)
    RUNNERS[chosen](config, start, end, master)
    tables = (*OUTPUT_TABLES, "origin_weather", "plane_attributes")
    return {t: storage.join(config.data_root, "prepared", t) for t in tables}
