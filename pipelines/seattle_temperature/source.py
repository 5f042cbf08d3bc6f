"""The `seattle_weather` data source: Seattle's daily weather 2012-2015, shipped inside ``vega_datasets``.

Raw: one observation a day (`observations`, landed by its local day): precipitation (mm), the day's
highest and lowest temperature (C), mean wind (m/s) and the weather's kind. Prepared, with pandas (a
row a day needs no Spark):

- `daily_weather`, the features known at the end of local day D (stamped at the local midnight that
  ends it): the day's values, their means (precipitation: its sum) over the `window_days` ending D,
  the change of the maximum since D - 1 and the season of the next day (the sine and cosine of its
  day of the year);
- `labels`, one per target day D: `next_temp_max`, D's highest temperature, forecast at the local
  midnight that starts D, so the point-in-time join gives it D - 1's features and never D's own.

Its Feast views are feature_repo/seattle_weather.py; the station is the entity (`SEA`).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field

from pipelines import storage, validate
from pipelines.config import PipelineConfig
from pipelines.errors import MissingDataError
from pipelines.sources import Expectation, Parameters, Source, register, section
from spark_jobs import layout

STATION = "SEA"
TIMEZONE = "America/Los_Angeles"
LABEL = "next_temp_max"
MEASURES = ("precipitation", "temp_max", "temp_min", "wind")
FEATURES = (
    *MEASURES,
    "temp_max_mean",
    "temp_min_mean",
    "precipitation_sum",
    "wind_mean",
    "temp_max_change",
    "season_sin",
    "season_cos",
)


class Features(Parameters):
    window_days: int = Field(7, ge=1, le=60, description="the days the means and the sum reach back over")


class Validation(Parameters):
    min_temp_c: float = Field(-25.0, description="the lowest temperature a raw day may report")
    max_temp_c: float = Field(45.0, description="the highest")
    max_precipitation_mm: float = Field(150.0, gt=0, description="the most rain a raw day may report")


def weather_features(config: PipelineConfig) -> Features:
    return section(config, "features", Features)


def weather_bounds(config: PipelineConfig) -> Validation:
    return section(config, "validation", Validation)


def data_file() -> Path:
    """The CSV the package ships, found without importing it."""
    spec = importlib.util.find_spec("vega_datasets")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError("the 'vega_datasets' package is not installed; install the pipeline extra")
    file = Path(next(iter(spec.submodule_search_locations))) / "_data" / "seattle-weather.csv"
    if not file.is_file():
        raise MissingDataError(f"vega_datasets' Seattle weather is missing: {file} does not exist")
    return file


def local_midnight_utc(days: pd.Series) -> pd.Series:
    """The UTC instant of the local midnight that starts each day (ISO date strings)."""
    return pd.to_datetime(days).dt.tz_localize(TIMEZONE).dt.tz_convert("UTC")


def daily_weather(raw: pd.DataFrame, window_days: int) -> pd.DataFrame:
    """The features of each raw day (one row each, oldest first), from the `window_days` ending it."""
    days = raw.sort_values("date").reset_index(drop=True)
    rolling = days[list(MEASURES)].rolling(window_days, min_periods=1)
    means, sums = rolling.mean(), rolling.sum()
    after = pd.to_datetime(days["date"]) + pd.Timedelta(days=1)
    angle = 2 * math.pi * (after.dt.dayofyear - 1) / 365.25
    frame = pd.DataFrame(
        {
            "station": STATION,
            "date": days["date"],
            "event_timestamp": local_midnight_utc(after.dt.strftime("%Y-%m-%d")),
            **{m: days[m].astype("float64") for m in MEASURES},
            "temp_max_mean": means["temp_max"],
            "temp_min_mean": means["temp_min"],
            "precipitation_sum": sums["precipitation"],
            "wind_mean": means["wind"],
            "temp_max_change": days["temp_max"].diff(),
            "season_sin": np.sin(angle),
            "season_cos": np.cos(angle),
        }
    )
    return frame


def labels(raw: pd.DataFrame) -> pd.DataFrame:
    """One label a day: its highest temperature, forecast at the local midnight that starts it."""
    days = raw.sort_values("date").reset_index(drop=True)
    return pd.DataFrame(
        {
            "forecast_id": STATION + "-" + days["date"],
            "station": STATION,
            "date": days["date"],
            "event_timestamp": local_midnight_utc(days["date"]),
            LABEL: days["temp_max"].astype("float64"),
        }
    )


@register
class SeattleWeather(Source):
    name = "seattle_weather"
    dated = ("observations",)
    first_date = dt.date(2012, 1, 1)
    last_date = dt.date(2015, 12, 31)
    features = Features
    validation = Validation
    prepared = ("labels", "daily_weather")
    feature_views = "seattle_weather.py"
    key_column = "forecast_id"
    entity_columns = ("forecast_id", "station")
    binary_label = False
    served_after = dt.timedelta(hours=9)  # local midnight is 08:00 UTC in winter, 07:00 in summer

    def load(self) -> dict[str, pd.DataFrame]:
        frame = pd.read_csv(data_file())
        frame["date"] = pd.to_datetime(frame["date"], format="%Y/%m/%d").dt.date
        return {"observations": frame}

    def lookback_days(self, features: Any) -> int:
        return int(features.window_days)  # the window before the first day, and its day before

    def prepare_pandas(
        self, config: PipelineConfig, raw: str, prepared: str, start: dt.date, end: dt.date
    ) -> dict[str, int]:
        window = weather_features(config).window_days
        url = storage.join(raw, "observations")
        days = layout.days(start, end)
        storage.require_partitions(url, days, "observations")
        present = set(storage.list_partitions(url))
        before = [start - dt.timedelta(days=n) for n in range(self.lookback_days(config.features), 0, -1)]
        observed = storage.read_partitions(url, [d for d in before if d in present] + days, "observations")
        observed["date"] = observed["date"].astype(str)
        in_range = observed["date"] >= start.isoformat()
        tables = {
            "labels": labels(observed[in_range]),
            "daily_weather": daily_weather(observed, window).pipe(
                lambda f: f[f["date"] >= start.isoformat()]
            ),
        }
        for table, frame in tables.items():
            storage.write_months(frame, storage.join(prepared, table), start, end, ("station",))
        return {table: len(frame) for table, frame in tables.items()}

    def raw_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        gxe, bounds = validate.expectations(), weather_bounds(config)
        days = (end - start).days + 1
        temperature = {"min_value": bounds.min_temp_c, "max_value": bounds.max_temp_c}
        return {
            "observations": [
                *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in (*MEASURES, "weather")),
                gxe.ExpectColumnValuesToBeBetween(column="temp_max", **temperature),
                gxe.ExpectColumnValuesToBeBetween(column="temp_min", **temperature),
                gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                    column_A="temp_max", column_B="temp_min", or_equal=True
                ),
                gxe.ExpectColumnValuesToBeBetween(
                    column="precipitation", min_value=0, max_value=bounds.max_precipitation_mm
                ),
                gxe.ExpectColumnValuesToBeBetween(column="wind", min_value=0, max_value=60),
                gxe.ExpectColumnValuesToBeInSet(
                    column="weather", value_set=["drizzle", "rain", "sun", "snow", "fog"]
                ),
                gxe.ExpectColumnValuesToBeUnique(column="date"),  # one observation a day
                gxe.ExpectTableRowCountToBeBetween(min_value=days, max_value=days),
                gxe.ExpectColumnDistinctValuesToContainSet(
                    column="date", value_set=validate.dates(start, end)
                ),
            ]
        }

    def feature_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        gxe, bounds = validate.expectations(), weather_bounds(config)
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

    def training_set_suite(self, feature_columns: Sequence[str], label: str) -> list[Expectation]:
        gxe = validate.expectations()
        return [
            gxe.ExpectColumnValuesToBeUnique(column="forecast_id"),
            gxe.ExpectColumnValuesToNotBeNull(column=label),
            *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in feature_columns),
            gxe.ExpectColumnValuesToBeBetween(column="season_cos", min_value=-1, max_value=1),
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
        ]

    def label_definition(self, config: PipelineConfig) -> str:
        return (
            "the next day's highest temperature in Seattle, degrees C, forecast at the local midnight before"
        )
