"""Spark job: raw hourly weather -> ``origin_weather`` features (one row per origin airport and hour).

    spark-submit pipelines/flights_delay/spark_jobs/prepare_weather.py \
        --run-date 2013-01-10 --input data/flights/raw --output data/flights/prepared
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from pipelines.flights_delay import HOME_TIMEZONE
from pipelines.flights_delay.spark_jobs import transforms
from spark_jobs import common, layout


def build_output(
    spark: SparkSession, input_url: str, start: dt.date, end: dt.date, overrides: Mapping[str, str]
) -> DataFrame:
    dates = layout.days(start, end)
    raw = common.read_dated(spark, f"{input_url}/weather", "weather", start, end, required=dates)
    airports = common.read_reference(spark, f"{input_url}/airports", "airports")
    return transforms.clean_weather(raw, transforms.timezone_table(spark, airports, overrides))


def run(spark: SparkSession, job: common.JobRun, overrides: Mapping[str, str] | None = None) -> None:
    input_url, output_url, start, end = job.input_url, job.output_url, job.start, job.end
    with common.stage(f"prepare_weather {start}..{end}"):
        common.write_months(
            common.with_month(build_output(spark, input_url, start, end, overrides or {})),
            f"{output_url}/origin_weather",
            start,
            end,
            ("origin", "event_timestamp"),
        )


def main(argv: Sequence[str] | None = None) -> int:
    common.configure_logging()
    parser = common.base_parser(__doc__.splitlines()[0], HOME_TIMEZONE)
    return common.job_main("prepare_weather", parser, argv, _run_args)


def _run_args(args: argparse.Namespace) -> None:
    job = common.job_run(args)  # checked before a session starts
    run(common.session_for("prepare_weather", args), job)


if __name__ == "__main__":
    sys.exit(main())
