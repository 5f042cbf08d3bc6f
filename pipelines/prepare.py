"""Preparation step: a data source's jobs for a date range, on Spark or pandas.

The source (pipelines/sources.py) names its Spark jobs, their scripts' folder and its pandas engine. Two
engines compute the same tables row for row (for flights: tests/data/test_data_engines.py): ``spark``
(the source's jobs in a local SparkSession with ``spark.master`` from the definition, or as
``spark-submit`` commands of its scripts against any master: :func:`spark_submit_commands`) and
``pandas`` (one process, bounded by its memory; flights': pipelines/flights_delay/prepare_pandas.py).
``engine: auto`` picks by the rows a run reads (the raw parquet footers): Spark from
``spark.spark_from_rows`` on, the crossover ``benchmarks/spark_prepare.py`` measured (docs/data.md).
Re-running a date replaces that date's rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import shlex

from pipelines import sources, storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, MissingDataError
from spark_jobs import layout

log = logging.getLogger(__name__)

ENGINES = ("auto", "spark", "pandas")


def choose_engine(engine: str, rows: int, spark_from_rows: int) -> str:
    """``spark`` or ``pandas``: the forced engine, or for ``auto`` Spark from ``spark_from_rows`` rows on."""
    if engine not in ENGINES:
        raise ConfigError(f"spark.engine: expected one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine
    return "spark" if rows >= spark_from_rows else "pandas"


def read_days(config: PipelineConfig, start: dt.date, end: dt.date) -> tuple[dt.date, dt.date]:
    """The raw days a preparation of ``start..end`` reads: the source's look-back first."""
    return start - dt.timedelta(days=sources.of(config).lookback_days(config.features)), end


def expected_rows(config: PipelineConfig, start: dt.date, end: dt.date) -> int:
    """Rows of the announced raw table a preparation of ``start..end`` reads, from the parquet
    footers (no data read)."""
    first, last = read_days(config, start, end)
    announced = sources.of(config).announced
    return storage.count_rows(storage.join(config.data_root, "raw", announced), first, last)


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
    source = sources.of(config)
    source.job(job)  # one of its jobs, or an error naming them
    raw, prepared = _urls(config)
    return [
        *("--run-date", str(start), "--end-date", str(end), "--input", raw, "--output", prepared),
        *("--shuffle-partitions", str(config.spark_shuffle_partitions)),
        *source.spark_arguments(config, job),
    ]


def spark_submit_commands(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    master: str | None = None,
) -> list[str]:
    """Shell commands that run the preparation through ``spark-submit`` (``--master`` from the config)."""
    start, end = start or config.start_date, end or config.end_date
    master = master or config.spark_master
    source = sources.of(config)
    return [
        shlex.join(
            [
                "spark-submit",
                "--master",
                master,
                "--conf",
                "spark.sql.session.timeZone=UTC",
                str(source.job_script(job)),
                *job_arguments(config, job, start, end),
            ]
        )
        for job in (j.name for j in source.spark_jobs)
    ]


def _run_spark(config: PipelineConfig, start: dt.date, end: dt.date, master: str | None) -> None:
    from spark_jobs import common

    source = sources.of(config)
    if not source.spark_jobs:
        raise ConfigError(f"spark.engine: source {source.name!r} has no Spark jobs; prepare it with pandas")
    raw, prepared = _urls(config)
    spark = common.build_session(
        "gpuyard-prepare", master or config.spark_master, config.spark_shuffle_partitions
    )
    try:
        run = common.JobRun(raw, prepared, start, end)
        for job in source.spark_jobs:
            source.run_spark(spark, job.name, run, config)
    except common.JobInputError as exc:
        raise MissingDataError(str(exc)) from exc


def _run_pandas(config: PipelineConfig, start: dt.date, end: dt.date, master: str | None) -> None:
    raw = storage.join(config.data_root, "raw")
    prepared = storage.join(config.data_root, "prepared")
    sources.of(config).prepare_pandas(config, raw, prepared, start, end)


RUNNERS = {"spark": _run_spark, "pandas": _run_pandas}


def prepare(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    master: str | None = None,
    engine: str | None = None,
) -> dict[str, str]:
    """The Airflow-callable step: run the source's jobs on ``engine`` (default: the config's, where
    ``auto`` picks by volume). Returns table -> URL."""
    start, end = start or config.start_date, end or config.end_date
    announced = sources.of(config).announced
    raw_announced = storage.join(config.data_root, "raw", announced)
    storage.require_partitions(raw_announced, layout.days(start, end), f"raw.{announced}")
    if engine is not None:
        config = config.replace(engine=engine)
    chosen, _ = resolve_engine(config, start, end)
    RUNNERS[chosen](config, start, end, master)
    return {t: storage.join(config.data_root, "prepared", t) for t in sources.of(config).prepared}
