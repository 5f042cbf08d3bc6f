"""Feast definitions for the Seattle temperature forecast: the station, its daily weather view, the service.

The source reads the prepared table ``daily_weather`` (``<prepared_root>/daily_weather/date_month=YYYY-MM/``,
pipelines/seattle_temperature/source.py), each row stamped at the local midnight that ends its day. The
prepared root and the source kind come from ``repo_settings.json`` beside this file (written by
``pipelines.features.render_repo``), as for flights' definitions.py.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureService, FeatureView, Field, ValueType
from feast.types import Float64

from feature_repo.offline import prepared_table

_SETTINGS = json.loads(Path(__file__).with_name("repo_settings.json").read_text())
PREPARED_ROOT: str = _SETTINGS["prepared_root"]
OFFLINE_SOURCE: str = _SETTINGS["offline_source"]
FEATURE_SERVICE_VERSION = "1"


station = Entity(
    name="station", join_keys=["station"], value_type=ValueType.STRING, description="a weather station"
)

daily_weather = FeatureView(
    name="daily_weather",
    entities=[station],
    ttl=timedelta(days=1),  # a forecast takes the day before's: stamped at the very instant it is made
    schema=[
        Field(name=name, dtype=Float64, description=text)
        for name, text in (
            ("precipitation", "the day's precipitation, mm"),
            ("temp_max", "the day's highest temperature, C"),
            ("temp_min", "the day's lowest temperature, C"),
            ("wind", "the day's mean wind, m/s"),
            ("temp_max_mean", "mean of the highest temperatures over the window ending the day"),
            ("temp_min_mean", "mean of the lowest temperatures over the window"),
            ("precipitation_sum", "precipitation over the window, mm"),
            ("wind_mean", "mean wind over the window"),
            ("temp_max_change", "the highest temperature's change since the day before"),
            ("season_sin", "sine of the next day's day of the year"),
            ("season_cos", "cosine of the next day's day of the year"),
        )
    ],
    source=prepared_table(
        PREPARED_ROOT,
        OFFLINE_SOURCE,
        "daily_weather",
        "daily weather at the station, known at the end of each local day",
    ),
    tags={"owner": "data-platform"},
)

temperature_forecast_v1 = FeatureService(
    name="temperature_forecast_v1",
    features=[daily_weather],
    description="features of the next-day temperature forecast (label: next_temp_max)",
    tags={"version": FEATURE_SERVICE_VERSION, "label": "next_temp_max"},
)
