"""Spark job: the planes reference table -> daily ``plane_attributes`` snapshots (what was known that day).

    spark-submit pipelines/flights_delay/spark_jobs/prepare_planes.py \
        --run-date 2013-01-10 --input data/flights/raw --output data/flights/prepared
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from pipelines.flights_delay import HOME_TIMEZONE
from pipelines.flights_delay.spark_jobs import transforms
from spark_jobs import common, layout


def build_output(
    spark: SparkSession, input_url: str, start: dt.date, end: dt.date, home_timezone: str
) -> DataFrame:
    planes = common.read_reference(spark, f"{input_url}/planes", "planes")
    days = layout.days(start, end)
    starts = [common.local_midnight_utc(d, home_timezone) for d in days]
    return transforms.plane_snapshots(planes, transforms.day_table(spark, days, starts))


def run(spark: SparkSession, job: common.JobRun, home_timezone: str = HOME_TIMEZONE) -> None:
    input_url, output_url, start, end = job.input_url, job.output_url, job.start, job.end
    with common.stage(f"prepare_planes {start}..{end}"):
        frame = build_output(spark, input_url, start, end, home_timezone)
        common.write_months(
            common.with_month(frame), f"{output_url}/plane_attributes", start, end, ("tailnum",)
        )


def main(argv: Sequence[str] | None = None) -> int:
    common.configure_logging()
    parser = common.base_parser(__doc__.splitlines()[0], HOME_TIMEZONE)
    return common.job_main("prepare_planes", parser, argv, _run_args)


def _run_args(args: argparse.Namespace) -> None:
    job = common.job_run(args)
    home = common.check_timezone(args.home_timezone, "--home-timezone")
    run(common.session_for("prepare_planes", args), job, home)


if __name__ == "__main__":
    sys.exit(main())
