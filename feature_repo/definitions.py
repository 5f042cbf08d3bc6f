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

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.data_source import DataSource
from feast.types import Float64, Int32, Int64

_SETTINGS_FILE = Path(__file__).with_name("repo_settings.json")
_SETTINGS = json.loads(_SETTINGS_FILE.read_text()) if _SETTINGS_FILE.is_file() else {}
PREPARED_ROOT: str = _SETTINGS.get("prepared_root") or os.environ.get(
    "GPUYARD_PREPARED_ROOT", str(Path("data/flights/prepared").absolute())
)
OFFLINE_SOURCE: str = _SETTINGS.get("offline_source") or os.environ.get("GPUYARD_OFFLINE_SOURCE", "file")
FEATURE_SERVICE_VERSION = "1"


def _source(table: str, description: str) -> DataSource:
    path = f"{PREPARED_ROOT.rstrip('/')}/{table}"
    if OFFLINE_SOURCE == "spark":
        from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

        # No date_partition_column: Feast prunes it by the UTC month of its time bounds, and the
        # months are local (New York) months, which begin up to five hours later.
        return SparkSource(
            name=table,
            path=path,
            file_format="parquet",
            timestamp_field="event_timestamp",
            description=description,
        )
    if OFFLINE_SOURCE != "file":
        raise ValueError(f"offline_source: expected 'file' or 'spark', got {OFFLINE_SOURCE!r}")
    return FileSource(name=table, path=path, timestamp_field="event_timestamp", description=description)


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

flight_schedule = FeatureView(
    name="flight_schedule",
    entities=[flight],
    ttl=timedelta(days=1),
    schema=[
        Field(name="distance", dtype=Float64, description="great-circle miles between the airports"),
        Field(name="sched_dep_hour", dtype=Int32, description="scheduled local departure hour (0-24)"),
        Field(name="sched_dep_weekday", dtype=Int32, description="1 = Sunday ... 7 = Saturday"),
        Field(name="month", dtype=Int32, description="month of the scheduled departure"),
        Field(name="sched_block_minutes", dtype=Float64, description="scheduled gate-to-gate minutes"),
    ],
    source=_source("flight_schedule", "per-flight schedule facts, stamped at scheduled departure"),
    tags={"owner": "data-platform"},
)

carrier_delay_stats = FeatureView(
    name="carrier_delay_stats",
    entities=[carrier],
    ttl=timedelta(hours=2),
    schema=[
        Field(
            name="carrier_flights", dtype=Int64, description="flights of the carrier ARRIVED in the last 24 h"
        ),
        Field(name="carrier_mean_arr_delay", dtype=Float64, description="their mean arrival delay, minutes"),
        Field(name="carrier_late_share", dtype=Float64, description="their share arriving > 15 min late"),
    ],
    source=_source("carrier_delay_stats", "hourly trailing-window delay statistics per carrier"),
    tags={"owner": "data-platform"},
)

route_delay_stats = FeatureView(
    name="route_delay_stats",
    entities=[route],
    ttl=timedelta(hours=7),  # refreshed every 6 hours
    schema=[
        Field(
            name="route_flights", dtype=Int64, description="flights on the route ARRIVED in the last 7 days"
        ),
        Field(name="route_mean_arr_delay", dtype=Float64, description="their mean arrival delay, minutes"),
        Field(name="route_late_share", dtype=Float64, description="their share arriving > 15 min late"),
    ],
    source=_source("route_delay_stats", "hourly trailing-window delay statistics per route"),
    tags={"owner": "data-platform"},
)

origin_weather = FeatureView(
    name="origin_weather",
    entities=[origin_airport],
    ttl=timedelta(hours=3),
    schema=[
        Field(name="temp", dtype=Float64, description="temperature, F"),
        Field(name="dewp", dtype=Float64, description="dew point, F"),
        Field(name="humid", dtype=Float64, description="relative humidity, %"),
        Field(name="wind_speed", dtype=Float64, description="wind speed, mph"),
        Field(name="wind_gust", dtype=Float64, description="gust speed, mph"),
        Field(name="precip", dtype=Float64, description="precipitation, inches"),
        Field(name="pressure", dtype=Float64, description="sea level pressure, millibars"),
        Field(name="visib", dtype=Float64, description="visibility, miles"),
    ],
    source=_source("origin_weather", "hourly weather observed at the origin airport"),
    tags={"owner": "data-platform"},
)

plane_attributes = FeatureView(
    name="plane_attributes",
    entities=[plane],
    ttl=timedelta(days=2),
    schema=[
        Field(name="plane_age_years", dtype=Float64, description="years since manufacture"),
        Field(name="seats", dtype=Float64, description="number of seats"),
        Field(name="engines", dtype=Float64, description="number of engines"),
    ],
    source=_source("plane_attributes", "daily snapshot of the planes reference table"),
    tags={"owner": "data-platform"},
)

flight_delay_v1 = FeatureService(
    name="flight_delay_v1",
    features=[flight_schedule, carrier_delay_stats, route_delay_stats, origin_weather, plane_attributes],
    description="features of the flight-delay model (label: is_late = arrival delay > 15 min)",
    tags={"version": FEATURE_SERVICE_VERSION, "label": "is_late"},
)
