"""The seattle_weather source's Great Expectations suites: raw observations, the prepared tables, the
training sets (run by pipelines/validate.py, which holds the helpers)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from pipelines import validate
from pipelines.seattle_temperature.prepare_pandas import FEATURES, LABEL, MEASURES, TIMEZONE
from pipelines.validate import Expectation


class Bounds(Protocol):
    """The source's validation bounds (source.Validation)."""

    min_temp_c: float
    max_temp_c: float
    max_precipitation_mm: float


def raw_observations(bounds: Bounds, start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = validate.expectations()
    days = (end - start).days + 1
    temperature = {"min_value": bounds.min_temp_c, "max_value": bounds.max_temp_c}
    return [
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in (*MEASURES, "weather")),
        gxe.ExpectColumnValuesToBeBetween(column="temp_max", **temperature),
        gxe.ExpectColumnValuesToBeBetween(column="temp_min", **temperature),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="temp_max", column_B="temp_min", or_equal=True),
        gxe.ExpectColumnValuesToBeBetween(
            column="precipitation", min_value=0, max_value=bounds.max_precipitation_mm
        ),
        gxe.ExpectColumnValuesToBeBetween(column="wind", min_value=0, max_value=60),
        gxe.ExpectColumnValuesToBeInSet(
            column="weather", value_set=["drizzle", "rain", "sun", "snow", "fog"]
        ),
        gxe.ExpectColumnValuesToBeUnique(column="date"),  # one observation a day
        gxe.ExpectTableRowCountToBeBetween(min_value=days, max_value=days),
        gxe.ExpectColumnDistinctValuesToContainSet(column="date", value_set=validate.dates(start, end)),
    ]


def features(bounds: Bounds, start: dt.date, end: dt.date) -> dict[str, list[Expectation]]:
    gxe = validate.expectations()
    days = (end - start).days + 1
    temperature = {"min_value": bounds.min_temp_c, "max_value": bounds.max_temp_c}
    return {
        "labels": [
            *validate.feature_table(["forecast_id"], start, end, (days, days), TIMEZONE, fresh_hours=26),
            gxe.ExpectColumnValuesToBeUnique(column="forecast_id"),
            gxe.ExpectColumnValuesToBeBetween(column=LABEL, **temperature),
        ],
        "daily_weather": [
            *validate.feature_table(["station"], start, end, (days, days), TIMEZONE, fresh_hours=2),
            *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in FEATURES if c != "temp_max_change"),
            gxe.ExpectColumnValuesToBeBetween(column="temp_max_mean", **temperature),
            gxe.ExpectColumnValuesToBeBetween(column="season_sin", min_value=-1, max_value=1),
            gxe.ExpectColumnValuesToBeBetween(column="precipitation_sum", min_value=0),
        ],
    }


def training_set(feature_columns: Sequence[str], label: str) -> list[Expectation]:
    gxe = validate.expectations()
    return [
        gxe.ExpectColumnValuesToBeUnique(column="forecast_id"),
        gxe.ExpectColumnValuesToNotBeNull(column=label),
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in feature_columns),
        gxe.ExpectColumnValuesToBeBetween(column="season_cos", min_value=-1, max_value=1),
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
    ]
