"""Shared plumbing for the Spark jobs: the session, the command-line contract and date partitions."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import layout

log = logging.getLogger("spark_jobs")

# -XX:-DontCompileHugeMethods: the JIT compiles whole-stage generated methods past 8000 bytes of
# bytecode too (the JVM's default leaves them interpreted): the flights' fused first stage took 35%
# less CPU at 1M rows. -XX:+UseParallelGC: a batch job wants throughput, not short pauses; G1's write
# barriers and refinement cost the flights job 10% of its tasks' CPU (20M rows on local[2]: 265 s
# with G1, 235 s with the parallel collector)
JVM_OPTIONS = "-Duser.timezone=UTC -XX:-DontCompileHugeMethods -XX:+UseParallelGC"


class JobInputError(ValueError):
    """A Spark job got a bad argument or is missing input; the message names what is wrong."""


def build_session(
    app: str,
    master: str | None = None,
    shuffle_partitions: int = 8,
    driver_memory: str | None = None,
) -> SparkSession:
    """The SparkSession the jobs use: UTC session clock, microsecond parquet timestamps, dynamic overwrite.

    ``master=None`` keeps what spark-submit configured (``local[*]`` when run as a plain script).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.appName(app)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.adaptive.coalescePartitions.enabled", "true")
        # pandas <-> Spark (Feast's entity frames, toPandas) through Arrow, not row by row
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # list date partitions on the driver: one Spark task per partition directory costs more
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
        .config("spark.ui.enabled", "false")
        # cached blocks spilled to disk are read back into the heap, not memory-mapped: mapped files
        # count as the process's resident memory, which a container's limit (or a benchmark's cap) sees
        .config("spark.storage.memoryMapThreshold", "2047m")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
    )
    if master:
        builder = builder.master(master)
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # getOrCreate reuses a running session: make the settings the jobs rely on hold there too
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    return spark


def parse_date(value: str, what: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except (TypeError, ValueError):
        raise JobInputError(f"{what}: expected a date as YYYY-MM-DD, got {value!r}") from None


def check_url(value: str, what: str) -> str:
    """Accept a local path or a URL with a scheme Spark can read; return it as Spark names it."""
    if not value or not value.strip():
        raise JobInputError(f"{what}: expected a path or URL, got {value!r}")
    value = value.strip().rstrip("/")
    scheme = urlparse(value).scheme
    if len(scheme) <= 1:
        return "file://" + os.path.abspath(value)
    if scheme == "s3":
        return "s3a://" + value[len("s3://") :]
    if scheme not in ("file", "s3a", "gs", "hdfs", "abfs", "abfss", "wasb", "wasbs", "viewfs", "memory"):
        raise JobInputError(f"{what}: unsupported URL scheme {scheme!r} in {value!r}")
    return value


def check_timezone(name: str, what: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise JobInputError(f"{what}: unknown IANA time zone {name!r}") from None
    return name


def base_parser(description: str, home_timezone: str) -> argparse.ArgumentParser:
    """The arguments every preparation job takes; ``home_timezone``, its source's local days' zone, is
    the default of ``--home-timezone``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run-date", required=True, help="first (or only) local date to process, YYYY-MM-DD")
    parser.add_argument("--end-date", default=None, help="last date to process (inclusive); default run-date")
    parser.add_argument("--input", required=True, help="raw data root URL (a folder per raw table)")
    parser.add_argument(
        "--output", required=True, help="prepared data root URL (receives one folder per table)"
    )
    parser.add_argument("--master", default=None, help="Spark master; default: spark-submit's, else local[*]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default=None)
    parser.add_argument("--home-timezone", default=home_timezone, help="time zone of the partition dates")
    return parser


def date_bounds(args: argparse.Namespace) -> tuple[dt.date, dt.date]:
    start = parse_date(args.run_date, "--run-date")
    end = parse_date(args.end_date, "--end-date") if args.end_date else start
    if end < start:
        raise JobInputError(f"--end-date {end} is before --run-date {start}")
    return start, end


@dataclass(frozen=True)
class JobRun:
    """What one run of a preparation job reads, writes and prepares: ``start..end`` (inclusive)."""

    input_url: str
    output_url: str
    start: dt.date
    end: dt.date


def job_run(args: argparse.Namespace) -> JobRun:
    """The run's first and last dates and its --input and --output URLs, checked in that order."""
    start, end = date_bounds(args)
    return JobRun(check_url(args.input, "--input"), check_url(args.output, "--output"), start, end)


def session_for(app: str, args: argparse.Namespace) -> SparkSession:
    """The session of job `app` as its --master, --shuffle-partitions and --driver-memory ask."""
    return build_session(app, args.master, args.shuffle_partitions, args.driver_memory)


def job_main(
    app: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    body: Callable[[argparse.Namespace], None],
) -> int:
    """A job's command line: `body` runs on the parsed `argv`. Its JobInputError (a bad argument,
    missing input) is printed as `<app>: <message>` with exit status 2; else the status is 0."""
    args = parser.parse_args(argv)
    try:
        body(args)
    except JobInputError as exc:
        print(f"{app}: {exc}", file=sys.stderr)
        return 2
    return 0


def local_midnight_utc(day: dt.date, timezone: str) -> dt.datetime:
    """The UTC instant (naive) of local midnight starting ``day`` in ``timezone``."""
    local = dt.datetime.combine(day, dt.time(0, 0), tzinfo=ZoneInfo(timezone))
    return local.astimezone(dt.UTC).replace(tzinfo=None)


def _local_root(url: str) -> str | None:
    return urlparse(url).path if url.startswith("file:") else None


def _names(spark: SparkSession, url: str) -> list[str]:
    """The entries of a folder (empty when it does not exist)."""
    local = _local_root(url)
    if local is not None:
        return [e.name for e in os.scandir(local)] if os.path.isdir(local) else []
    fs, path = _hadoop_fs(spark, url)
    if not fs.exists(path):  # type: ignore[attr-defined]
        return []
    return [str(s.getPath().getName()) for s in fs.listStatus(path)]  # type: ignore[attr-defined]


def existing_dates(spark: SparkSession, table_url: str) -> set[str]:
    """Partition dates present under ``table_url`` (any scheme; a local folder is listed directly)."""
    names = _names(spark, table_url)
    return {n.split("=", 1)[1] for n in names if n.startswith("date=") and "." not in n}


def dated_glob(table_url: str, lo: dt.date, hi: dt.date) -> str:
    """A glob of the day partitions of the months ``lo..hi`` touch. Spark lists a glob's folders in
    one pass (3.7 s for 5 years of days on local[2] here), the whole table's in 31 s at 40 years,
    and a list of 1,826 folders or files one by one in over a minute."""
    return f"{table_url.rstrip('/')}/date={{{','.join(layout.months(lo, hi))}}}-*"


def read_dated(
    spark: SparkSession, table_url: str, table: str, lo: dt.date, hi: dt.date, required: Sequence[dt.date]
) -> DataFrame:
    """Read the partitions of ``table`` between ``lo`` and ``hi``; every date in ``required`` must exist."""
    present = existing_dates(spark, table_url)
    if not present:
        raise JobInputError(f"input table {table!r} does not exist or is empty at {table_url}")
    missing = [d.isoformat() for d in required if d.isoformat() not in present]
    if missing:
        raise JobInputError(
            f"input table {table!r} at {table_url} has no partition for {len(missing)} date(s): "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    frame = spark.read.option("basePath", table_url).parquet(dated_glob(table_url, lo, hi))
    return frame.where(F.col("date").between(lo.isoformat(), hi.isoformat()))


def read_reference(spark: SparkSession, table_url: str, table: str) -> DataFrame:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    path = jvm.org.apache.hadoop.fs.Path(table_url)
    if not path.getFileSystem(conf).exists(path):
        raise JobInputError(f"input table {table!r} does not exist at {table_url}")
    return spark.read.parquet(table_url)


def write_dated(frame: DataFrame, table_url: str) -> None:
    """Write a landing table ``frame`` partitioned by day, replacing exactly the dates it holds."""
    (
        frame.repartition("date")
        .sortWithinPartitions("date")
        .write.mode("overwrite")
        .partitionBy("date")
        .parquet(table_url)
    )


def _hadoop_fs(spark: SparkSession, url: str) -> tuple[object, object]:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    path = jvm.org.apache.hadoop.fs.Path(url)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path  # type: ignore[attr-defined]


def write_months(
    frame: DataFrame,
    table_url: str,
    start: dt.date,
    end: dt.date,
    sort: Sequence[str] = (),
    clustered: bool = False,
    plain: Sequence[str] = (),
) -> None:
    """Replace the dates ``start..end`` of a prepared table laid out by month (spark_jobs/layout.py).

    ``frame`` holds the new rows of those dates (with ``date`` and ``date_month`` columns).
    ``clustered``: each month of ``frame`` is already in one Spark partition, so a table that holds
    none of those months yet is written without a shuffle. Months the range only partly covers keep
    their other dates' rows. ``plain``: columns of (nearly) unique values, written without parquet's
    dictionary encoding (it would hash every value only to give up). Each month is one file sorted by
    ``date`` (then ``sort``), written to a
    staging folder first; the finished months then replace the old ones, so a failed job leaves the
    table as it was.
    """
    spark = frame.sparkSession
    touched = layout.months(start, end)
    names = _names(spark, table_url)
    if any(n.startswith(f"{layout.DAY_KEY}=") for n in names):
        raise JobInputError(
            f"prepared table {table_url} is laid out by day (an older layout): delete it and "
            "prepare its dates again"
        )
    on_disk = {n.split("=", 1)[1] for n in names if n.startswith(f"{layout.MONTH_KEY}=")}
    fresh = frame
    if on_disk & set(touched):
        kept = (
            spark.read.parquet(table_url)
            .where(F.col(layout.MONTH_KEY).isin(sorted(on_disk & set(touched))))
            .where(~F.col("date").between(start.isoformat(), end.isoformat()))
        )
        fresh = fresh.unionByName(kept.select(*fresh.columns))
        clustered = False
    if not clustered:
        fresh = fresh.repartition(layout.MONTH_KEY)
    staging = f"{table_url.rstrip('/')}/_staging-{uuid.uuid4().hex[:8]}"
    (
        fresh.sortWithinPartitions(layout.MONTH_KEY, "date", *sort)
        .write.mode("overwrite")
        .options(**{f"parquet.enable.dictionary#{c}": "false" for c in plain})
        .partitionBy(layout.MONTH_KEY)
        .parquet(staging)
    )
    fs, root = _hadoop_fs(spark, table_url)
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    for month in touched:
        name = layout.partition_name(layout.MONTH_KEY, month)
        target = jvm.org.apache.hadoop.fs.Path(root, name)
        staged = jvm.org.apache.hadoop.fs.Path(f"{staging}/{name}")
        if fs.exists(target):  # type: ignore[attr-defined]
            fs.delete(target, True)  # type: ignore[attr-defined]
        if fs.exists(staged):  # type: ignore[attr-defined]
            fs.rename(staged, target)  # type: ignore[attr-defined]
    fs.delete(jvm.org.apache.hadoop.fs.Path(staging), True)  # type: ignore[attr-defined]


def with_month(frame: DataFrame) -> DataFrame:
    """``frame`` with its ``date_month`` (the month partition of a prepared table)."""
    return frame.withColumn(layout.MONTH_KEY, F.substring("date", 1, 7))


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Log the start and duration of a stage (progress for long jobs)."""
    log.info("%s ...", name)
    started = time.perf_counter()
    yield
    log.info("%s done in %.1fs", name, time.perf_counter() - started)


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
