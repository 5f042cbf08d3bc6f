"""Feast definitions for the flight-delay model: entities, sources over the Spark outputs, views, service.

The sources read the prepared tables (``<prepared_root>/<table>/date_month=YYYY-MM/``, spark_jobs/layout.py).
The prepared root and the source kind (``file`` for the embedded store, ``spark`` in production) come from
``repo_settings.json`` beside this file (written by ``pipelines.features.render_repo``), else from the
environment (``GPUYARD_PREPARED_ROOT``, ``GPUYARD_OFFLINE_SOURCE``), else ``data/flights/prepared``.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from feast import Entity, FeatureService, FeatureView, Field, ValueType
from feast.types import Float64, Int32, Int64

from feature_repo.offline import prepared_table

_SETTINGS_FILE = Path(__file__).with_name("repo_settings.json")
_SETTINGS = json.loads(_SETTINGS_FILE.read_text()) if _SETTINGS_FILE.is_file() else {}
PREPARED_ROOT: str = _SETTINGS.get("prepared_root") or os.environ.get(
    "GPUYARD_PREPARED_ROOT", str(Path("data/flights/prepared").absolute())
)
OFFLINE_SOURCE: str = _SETTINGS.get("offline_source") or os.environ.get("GPUYARD_OFFLINE_SOURCE", "file")
FEATURE_SERVICE_VERSION = "1"


def _view(
    table: str, entity: Entity, ttl: timedelta, about: str, fields: list[tuple[str, Any, str]]
) -> FeatureView:
    """The view of prepared table `table`, its fields given as (name, type, description)."""
    return FeatureView(
        name=table,
        entities=[entity],
        ttl=ttl,
        schema=[Field(name=name, dtype=dtype, description=text) for name, dtype, text in fields],
        source=prepared_table(PREPARED_ROOT, OFFLINE_SOURCE, table, about),
        tags={"owner": "data-platform"},
    )


flight = Entity(
    name="flight", join_keys=["flight_id"], value_type=ValueType.STRING, description="one scheduled flight"
)
carrier = Entity(
    name="carrier", join_keys=["carrier"], value_type=ValueType.STRING, description="airline code"
)
route = Entity(name="route", join_keys=["route"], value_type=ValueType.STRING, description="ORIGIN-DEST pair")
origin_airport = Entity(
    name="origin_airport", join_keys=["origin"], value_type=ValueType.STRING, description="departure airport"
)
plane = Entity(
    name="plane", join_keys=["tailnum"], value_type=ValueType.STRING, description="aircraft tail number"
)

flight_schedule = _view(
    "flight_schedule",
    flight,
    timedelta(days=1),
    "per-flight schedule facts, stamped at scheduled departure",
    [
        ("distance", Float64, "great-circle miles between the airports"),
        ("sched_dep_hour", Int32, "scheduled local departure hour (0-24)"),
        ("sched_dep_weekday", Int32, "1 = Sunday ... 7 = Saturday"),
        ("month", Int32, "month of the scheduled departure"),
        ("sched_block_minutes", Float64, "scheduled gate-to-gate minutes"),
    ],
)

carrier_delay_stats = _view(
    "carrier_delay_stats",
    carrier,
    timedelta(hours=2),
    "hourly trailing-window delay statistics per carrier",
    [
        ("carrier_flights", Int64, "flights of the carrier ARRIVED in the last 24 h"),
        ("carrier_mean_arr_delay", Float64, "their mean arrival delay, minutes"),
        ("carrier_late_share", Float64, "their share arriving > 15 min late"),
    ],
)

route_delay_stats = _view(
    "route_delay_stats",
    route,
    timedelta(hours=7),  # refreshed every 6 hours
    "hourly trailing-window delay statistics per route",
    [
        ("route_flights", Int64, "flights on the route ARRIVED in the last 7 days"),
        ("route_mean_arr_delay", Float64, "their mean arrival delay, minutes"),
        ("route_late_share", Float64, "their share arriving > 15 min late"),
    ],
)

origin_weather = _view(
    "origin_weather",
    origin_airport,
    timedelta(hours=3),
    "hourly weather observed at the origin airport",
    [
        ("temp", Float64, "temperature, F"),
        ("dewp", Float64, "dew point, F"),
        ("humid", Float64, "relative humidity, %"),
        ("wind_speed", Float64, "wind speed, mph"),
        ("wind_gust", Float64, "gust speed, mph"),
        ("precip", Float64, "precipitation, inches"),
        ("pressure", Float64, "sea level pressure, millibars"),
        ("visib", Float64, "visibility, miles"),
    ],
)

plane_attributes = _view(
    "plane_attributes",
    plane,
    timedelta(days=2),
    "daily snapshot of the planes reference table",
    [
        ("plane_age_years", Float64, "years since manufacture"),
        ("seats", Float64, "number of seats"),
        ("engines", Float64, "number of engines"),
    ],
)

flight_delay_v1 = FeatureService(
    name="flight_delay_v1",
    features=[flight_schedule, carrier_delay_stats, route_delay_stats, origin_weather, plane_attributes],
    description="features of the flight-delay model (label: is_late = arrival delay > 15 min)",
    tags={"version": FEATURE_SERVICE_VERSION, "label": "is_late"},
)
