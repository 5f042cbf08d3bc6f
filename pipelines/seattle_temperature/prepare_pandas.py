"""The seattle_weather source's preparation, with pandas (a row a day needs no Spark): `daily_weather`
and `labels` (pipelines/seattle_temperature/source.py says what each holds)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd

from pipelines import storage
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


def run(raw: str, prepared: str, start: dt.date, end: dt.date, window_days: int) -> dict[str, int]:
    """Prepare the days start..end from the raw observations (and the `window_days` before start, where
    landed); returns each table's row count."""
    url = storage.join(raw, "observations")
    days = layout.days(start, end)
    storage.require_partitions(url, days, "observations")
    present = set(storage.list_partitions(url))
    before = [start - dt.timedelta(days=n) for n in range(window_days, 0, -1)]
    observed = storage.read_partitions(url, [d for d in before if d in present] + days, "observations")
    observed["date"] = observed["date"].astype(str)
    in_range = observed["date"] >= start.isoformat()
    tables = {
        "labels": labels(observed[in_range]),
        "daily_weather": daily_weather(observed, window_days).pipe(
            lambda f: f[f["date"] >= start.isoformat()]
        ),
    }
    for table, frame in tables.items():
        storage.write_months(frame, storage.join(prepared, table), start, end, ("station",))
    return {table: len(frame) for table, frame in tables.items()}
