"""Spark job: multiplies the 2013 flights and weather into later years for scale tests (seeded).

Copy ``k`` (``0 <= k < copies``) moves every row ``k`` years forward (copy 0 is the original data) and, for
``k >= 1``, perturbs it with noise derived from ``xxhash64(seed, k, row key)``: departure delays move by
-10..+10 minutes, arrival delays by that plus -5..+5, temperatures by -0.5..+0.5 F. Cancelled flights stay
cancelled and the schedule is kept, so the data stays real-shaped. The same seed and copies always give the
same rows. In leap years February 29 repeats February 28. 60 copies give 20.2 million flights (2013..2072).

``--replicas R`` also repeats every day's schedule R times within its day (replica ``r`` flies flight number
``flight + 10000 * r`` with its own noise): denser days, fewer date partitions for the same row count
(a busier airport system). ``--copies 15 --replicas 4`` also gives 20.2 million flights.

    spark-submit pipelines/flights_delay/spark_jobs/scale_up.py \
        --input data/flights/raw --output data/scaled/raw --copies 60
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.flights_delay import HOME_TIMEZONE
from spark_jobs import common

FLIGHTS_PER_COPY = 336_776
REFERENCE_TABLES = ("planes", "airlines", "airports")


def _hhmm(minutes: Column) -> Column:
    wrapped = F.pmod(minutes.cast("long"), F.lit(1440))
    return (F.floor(wrapped / 60) * 100 + wrapped % 60).cast("double")


def _minutes(hhmm: Column) -> Column:
    return F.floor(hhmm / 100) * 60 + hhmm % 100


def _time_hour(year: Column, month: Column, day: Column, hour: Column, timezone: str) -> Column:
    midnight = F.unix_timestamp(F.to_timestamp(F.make_date(year, month, day)))
    wall = F.timestamp_seconds(midnight + hour.cast("long") * 3600)
    return F.date_format(F.to_utc_timestamp(wall, timezone), "yyyy-MM-dd'T'HH:mm:ss'Z'")


def _is_leap(year: Column) -> Column:
    return (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))


def with_leap_days(rows: DataFrame) -> DataFrame:
    """Rows (joined with their ``copy``) plus, for target years that are leap years, February 28 again as
    February 29 (the 2013 source has no leap day; a missing date would break date-range jobs)."""
    target = F.col("year") + F.col("copy")
    feb28 = (F.col("month") == 2) & (F.col("day") == 28) & _is_leap(target)
    extra = rows.where(feb28).withColumn("day", F.lit(29).cast(rows.schema["day"].dataType))
    return rows.unionByName(extra)


def copies_frame(spark: SparkSession, copies: int, replicas: int = 1) -> DataFrame:
    """One row per (copy, replica): copy = years forward, replica = repetition within the day."""
    years = spark.range(copies).withColumnRenamed("id", "copy")
    return years.crossJoin(spark.range(replicas).withColumnRenamed("id", "replica"))


def scale_flights(flights: DataFrame, copies: DataFrame, seed: int, home_timezone: str) -> DataFrame:
    """Every flight once per copy, ``copy`` years later, with seeded delay noise for copies >= 1."""
    rows = with_leap_days(flights.drop("date").crossJoin(F.broadcast(copies)))
    noise_key = F.xxhash64(
        F.lit(seed),
        F.col("copy"),
        F.col("replica"),
        "carrier",
        "flight",
        "origin",
        "month",
        "day",
        "sched_dep_time",
    )
    original = (F.col("copy") == 0) & (F.col("replica") == 0)
    dep_noise = F.when(~original, F.pmod(noise_key, F.lit(21)) - 10).otherwise(0).cast("double")
    arr_noise = (
        F.when(~original, F.pmod(F.floor(noise_key / 21), F.lit(11)) - 5).otherwise(0).cast("double")
        + dep_noise
    )
    year = (F.col("year") + F.col("copy")).cast("long")
    dep_delay = F.col("dep_delay") + dep_noise
    return rows.select(
        year.alias("year"),
        "month",
        "day",
        F.when(F.col("dep_time").isNull(), None)
        .when(original, F.col("dep_time"))
        .otherwise(_hhmm(_minutes(F.col("sched_dep_time")) + dep_delay))
        .alias("dep_time"),
        "sched_dep_time",
        dep_delay.alias("dep_delay"),
        F.when(F.col("arr_time").isNull(), None)
        .when(original, F.col("arr_time"))
        .otherwise(_hhmm(_minutes(F.col("arr_time")) + arr_noise))
        .alias("arr_time"),
        "sched_arr_time",
        (F.col("arr_delay") + arr_noise).alias("arr_delay"),
        "carrier",
        (F.col("flight") + F.col("replica") * 10000).cast("long").alias("flight"),
        "tailnum",
        "origin",
        "dest",
        "air_time",
        "distance",
        "hour",
        "minute",
        _time_hour(year, F.col("month"), F.col("day"), F.col("hour"), home_timezone).alias("time_hour"),
        F.date_format(F.make_date(year, F.col("month"), F.col("day")), "yyyy-MM-dd").alias("date"),
    )


def scale_weather(weather: DataFrame, copies: DataFrame, seed: int, home_timezone: str) -> DataFrame:
    """Weather once per copy (year); replicas share their day's weather."""
    rows = with_leap_days(
        weather.drop("date").crossJoin(F.broadcast(copies.where("replica = 0").drop("replica")))
    )
    noise = F.when(
        F.col("copy") > 0,
        (F.pmod(F.xxhash64(F.lit(seed), F.col("copy"), "origin", "month", "day", "hour"), F.lit(11)) - 5)
        / 10.0,
    ).otherwise(0.0)
    year = (F.col("year") + F.col("copy")).cast("long")
    columns = [c for c in weather.columns if c not in ("date", "year", "temp", "time_hour")]
    return rows.select(
        year.alias("year"),
        *columns,
        (F.col("temp") + noise).alias("temp"),
        _time_hour(year, F.col("month"), F.col("day"), F.col("hour"), home_timezone).alias("time_hour"),
        F.date_format(F.make_date(year, F.col("month"), F.col("day")), "yyyy-MM-dd").alias("date"),
    )


def run(
    spark: SparkSession,
    input_url: str,
    output_url: str,
    copies: int,
    seed: int,
    home_timezone: str = HOME_TIMEZONE,
    replicas: int = 1,
) -> int:
    """Write the scaled raw tables; returns the flights written (copies x replicas x source flights)."""
    if copies < 1 or replicas < 1:
        raise common.JobInputError(f"--copies and --replicas: expected at least 1, got {copies}, {replicas}")
    if input_url.rstrip("/") == output_url.rstrip("/"):
        raise common.JobInputError(
            "--output must differ from --input (the scaled data would mix with the source)"
        )
    copy_ids = copies_frame(spark, copies, replicas)
    flights = common.read_reference(spark, f"{input_url}/flights", "flights")
    weather = common.read_reference(spark, f"{input_url}/weather", "weather")
    for table in REFERENCE_TABLES:
        with common.stage(f"scale_up: copy {table}"):
            common.read_reference(spark, f"{input_url}/{table}", table).write.mode("overwrite").parquet(
                f"{output_url}/{table}"
            )
    with common.stage(f"scale_up: weather x{copies}"):
        common.write_dated(scale_weather(weather, copy_ids, seed, home_timezone), f"{output_url}/weather")
    with common.stage(f"scale_up: flights x{copies}"):
        common.write_dated(scale_flights(flights, copy_ids, seed, home_timezone), f"{output_url}/flights")
    return int(with_leap_days(flights.crossJoin(copy_ids)).count())


def main(argv: Sequence[str] | None = None) -> int:
    common.configure_logging()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="raw data root holding the landed 2013 tables")
    parser.add_argument("--output", required=True, help="raw data root that receives the scaled tables")
    parser.add_argument(
        "--copies", type=int, default=60, help="years of data to produce (60 -> 20.2M flights)"
    )
    parser.add_argument("--replicas", type=int, default=1, help="repetitions of each day's schedule")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--master", default=None)
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default=None)
    return common.job_main("scale_up", parser, argv, _run_args)


def _run_args(args: argparse.Namespace) -> None:
    input_url = common.check_url(args.input, "--input")
    output_url = common.check_url(args.output, "--output")
    spark = common.session_for("scale_up", args)
    rows = run(spark, input_url, output_url, args.copies, args.seed, replicas=args.replicas)
    print(f"scale_up: wrote {rows} flights ({args.copies} years x {args.replicas} replicas) to {output_url}")


if __name__ == "__main__":
    sys.exit(main())
