"""Spark job: raw flights -> labels, per-flight schedule features, carrier and route trailing delay stats.

Reads ``<input>/flights`` (partitions of the run dates plus a look-back for the trailing windows) and
``<input>/airports``; writes ``labels``, ``flight_schedule``, ``carrier_delay_stats`` and
``route_delay_stats`` under ``<output>``, replacing only the run dates' partitions.

    spark-submit pipelines/flights_delay/spark_jobs/prepare_flights.py \
        --run-date 2013-01-10 --input data/flights/raw --output data/flights/prepared
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.flights_delay import HOME_TIMEZONE
from pipelines.flights_delay.spark_jobs import transforms
from spark_jobs import common, layout

OUTPUT_TABLES = ("labels", "flight_schedule", "carrier_delay_stats", "route_delay_stats")
# what the four outputs read of the prepared flights (the cache holds only these)
CACHED = (
    *("flight_id", "date", "date_month", "year", "month", "day", "sched_dep_time", "distance", "arr_delay"),
    *("carrier", "origin", "dest", "route", "tailnum", "sched_dep_ts", "sched_arr_ts", "arrival_ts"),
)
# the order of the rows within a date in each table's files
SORT = {
    "labels": (),
    "flight_schedule": (),
    "carrier_delay_stats": ("carrier", "event_timestamp"),
    "route_delay_stats": ("route", "event_timestamp"),
}
# columns whose values are unique per row: no parquet dictionary
PLAIN = {"labels": ("flight_id",), "flight_schedule": ("flight_id",)}


@dataclass(frozen=True)
class FlightJobParams:
    """Parameters of the flights preparation (defaults match ``pipeline.yaml`` beside this folder)."""

    carrier_window_hours: int = 24
    route_window_hours: int = 168
    carrier_step_hours: int = 1
    route_step_hours: int = 6
    late_minutes: int = 15
    timezone_overrides: Mapping[str, str] = field(default_factory=dict)
    home_timezone: str = HOME_TIMEZONE

    @property
    def lookback_days(self) -> int:
        # a flight departs at most ~1 day late and flies under a day: 2 extra days cover every arrival
        return math.ceil(max(self.carrier_window_hours, self.route_window_hours) / 24) + 2


def prepared_flights(
    spark: SparkSession, input_url: str, start: dt.date, end: dt.date, params: FlightJobParams
) -> DataFrame:
    """Cleaned, de-duplicated flights of ``start - lookback .. end`` with their UTC times."""
    dates = layout.days(start, end)
    lo = start - dt.timedelta(days=params.lookback_days)
    raw = common.read_dated(spark, f"{input_url}/flights", "flights", lo, end, required=dates)
    # one shuffle, by month: the de-duplication (its key holds the date) and the month files of
    # labels and flight_schedule need no other. Hashed, not by range: a range needs a sampling pass
    # over the whole input first, and a month in one partition is all the writes need
    months = len(layout.months(lo, end))
    raw = raw.repartition(months, F.substring(F.col("date").cast("string"), 1, 7))
    airports = common.read_reference(spark, f"{input_url}/airports", "airports")
    # a few hundred airports: computed once and broadcast from the driver, not re-planned per join
    zones = transforms.timezone_table(spark, airports, params.timezone_overrides).collect()
    timezones = spark.createDataFrame(zones, "faa string, tzone string")
    return transforms.add_flight_times(transforms.clean_flights(raw), timezones, [z.tzone for z in zones])


def build_outputs(
    spark: SparkSession, flights: DataFrame, start: dt.date, end: dt.date, params: FlightJobParams
) -> dict[str, DataFrame]:
    """The four output tables for ``start..end`` from prepared flights (which include the look-back)."""
    in_range = flights.where(F.col("date").between(start.isoformat(), end.isoformat()))
    first = common.local_midnight_utc(start, params.home_timezone)
    last = common.local_midnight_utc(end + dt.timedelta(days=1), params.home_timezone)
    stats = {
        f"{entity}_delay_stats": transforms.delay_window_stats(
            flights,
            transforms.hourly_grid(spark, first, last, step),
            entity,
            hours,
            params.late_minutes,
            entity,
            params.home_timezone,
            partitions=len(layout.months(start, end)),
        )
        for entity, hours, step in (
            ("carrier", params.carrier_window_hours, params.carrier_step_hours),
            ("route", params.route_window_hours, params.route_step_hours),
        )
    }
    return {
        "labels": transforms.labels(in_range, params.late_minutes),
        "flight_schedule": transforms.schedule_features(in_range),
        **stats,
    }


def run(spark: SparkSession, job: common.JobRun, params: FlightJobParams) -> None:
    input_url, output_url, start, end = job.input_url, job.output_url, job.start, job.end
    with common.stage(f"prepare_flights {start}..{end}: clean and time flights"):
        flights = prepared_flights(spark, input_url, start, end, params).select(*CACHED).cache()
    try:
        outputs = build_outputs(spark, flights, start, end, params)
        for table, frame in outputs.items():
            with common.stage(f"prepare_flights {start}..{end}: write {table}"):
                # every output is clustered by month: the flights by their shuffle, the statistics
                # by their window's
                common.write_months(
                    frame,
                    f"{output_url}/{table}",
                    start,
                    end,
                    SORT[table],
                    clustered=True,
                    plain=PLAIN.get(table, ()),
                )
    finally:
        flights.unpersist()


def parse_overrides(value: str | None) -> dict[str, str]:
    """``--timezone-overrides``: the airports' zones, checked, that the airports table lacks."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise common.JobInputError(
            f"--timezone-overrides: expected a JSON object, got {value!r} ({exc})"
        ) from None
    if not isinstance(parsed, dict):
        raise common.JobInputError(f"--timezone-overrides: expected a JSON object, got {value!r}")
    return {str(k): common.check_timezone(str(v), f"--timezone-overrides[{k}]") for k, v in parsed.items()}


def main(argv: Sequence[str] | None = None) -> int:
    common.configure_logging()
    parser = common.base_parser(__doc__.splitlines()[0], HOME_TIMEZONE)
    parser.add_argument("--carrier-window-hours", type=int, default=24)
    parser.add_argument("--route-window-hours", type=int, default=168)
    parser.add_argument("--carrier-step-hours", type=int, default=1, help="refresh cadence of carrier stats")
    parser.add_argument("--route-step-hours", type=int, default=6, help="refresh cadence of route stats")
    parser.add_argument("--late-minutes", type=int, default=15)
    parser.add_argument(
        "--timezone-overrides", default=None, help='JSON object, e.g. {"SJU": "America/Puerto_Rico"}'
    )
    return common.job_main("prepare_flights", parser, argv, _run_args)


def _run_args(args: argparse.Namespace) -> None:
    for flag in ("carrier_window_hours", "route_window_hours", "carrier_step_hours", "route_step_hours"):
        if getattr(args, flag) < 1:
            raise common.JobInputError(
                f"--{flag.replace('_', '-')}: expected >= 1, got {getattr(args, flag)}"
            )
    job = common.job_run(args)
    params = FlightJobParams(
        carrier_window_hours=args.carrier_window_hours,
        route_window_hours=args.route_window_hours,
        carrier_step_hours=args.carrier_step_hours,
        route_step_hours=args.route_step_hours,
        late_minutes=args.late_minutes,
        timezone_overrides=parse_overrides(args.timezone_overrides),
        home_timezone=common.check_timezone(args.home_timezone, "--home-timezone"),
    )
    run(common.session_for("prepare_flights", args), job, params)


if __name__ == "__main__":
    sys.exit(main())
