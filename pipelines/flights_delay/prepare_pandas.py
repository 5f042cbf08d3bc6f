"""The flights' preparation in one pandas process, row for row that of the Spark jobs beside it (spark_jobs/).

The engine for small volumes (`engine: pandas`, or `auto` under the measured crossover, see
pipelines/prepare.py) and the reference the Spark jobs are checked against
(tests/data/test_data_engines.py compares every table row for row). Times follow Spark's rules
(spark_jobs/transforms.py): local wall clocks become UTC with the airport's IANA zone; a wall
clock in a DST gap moves forward by the gap, an ambiguous one takes the earlier instant.
Everything is held in memory: this engine is bounded by the machine, which is why Spark exists.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import numpy as np
import pandas as pd

from pipelines import storage
from pipelines.flights_delay.spark_jobs.prepare_flights import FlightJobParams
from pipelines.flights_delay.spark_jobs.transforms import (
    DELAY_RANGE,
    FLIGHT_KEY,
    WEATHER_COLUMNS,
    WEATHER_RANGES,
)
from spark_jobs import common, layout

HOUR_US = 3_600_000_000


def hhmm_minutes(values: pd.Series) -> pd.Series:
    """Minutes after midnight of an ``hhmm`` number; NaN when not a valid clock time (2400 is midnight)."""
    hours, minutes = values // 100, values % 100
    valid = values.notna() & (values >= 0) & (hours <= 24) & (minutes < 60) & ~((hours == 24) & (minutes > 0))
    return (hours * 60 + minutes).where(valid)


def to_utc(wall: pd.Series, zones: pd.Series) -> pd.Series:
    """Local wall clocks (naive) -> UTC per row's zone (NaT where the zone is missing)."""
    out = pd.Series(pd.NaT, index=wall.index, dtype="datetime64[us, UTC]")
    for zone, index in wall.groupby(zones).groups.items():
        local = wall.loc[index].dt.tz_localize(
            str(zone), ambiguous=np.ones(len(index), dtype=bool), nonexistent=pd.Timedelta(hours=1)
        )
        out.loc[index] = local.dt.tz_convert("UTC")
    return out


def timezones(airports: pd.DataFrame, overrides: Mapping[str, str]) -> dict[str, str]:
    """``faa -> tzone`` from the airports table, with ``overrides`` winning."""
    known = airports.assign(faa=airports["faa"].astype(str).str.strip().str.upper()).dropna(subset=["tzone"])
    return dict(zip(known["faa"], known["tzone"], strict=True)) | dict(overrides)


def _code(values: pd.Series) -> pd.Series:
    text = values.astype("string").str.strip().str.upper()
    text = text.mask((text == "").fillna(False))
    return text.astype(object).where(text.notna(), None)


def clean_flights(raw: pd.DataFrame) -> pd.DataFrame:
    """Types, trimmed codes, impossible values to NaN, unusable rows dropped, duplicates removed."""
    f = pd.DataFrame(
        {
            "date": raw["date"].astype(str),
            "year": raw["year"].astype("int32"),
            "month": raw["month"].astype("int32"),
            "day": raw["day"].astype("int32"),
            "dep_time": raw["dep_time"].astype("float64"),
            "sched_dep_time": raw["sched_dep_time"].astype("float64"),
            "dep_delay": raw["dep_delay"].astype("float64"),
            "arr_time": raw["arr_time"].astype("float64"),
            "sched_arr_time": raw["sched_arr_time"].astype("float64"),
            "arr_delay": raw["arr_delay"].astype("float64"),
            "carrier": _code(raw["carrier"]),
            "flight": raw["flight"].astype("float64"),
            "tailnum": _code(raw["tailnum"]),
            "origin": _code(raw["origin"]),
            "dest": _code(raw["dest"]),
            "air_time": raw["air_time"].astype("float64"),
            "distance": raw["distance"].astype("float64"),
        }
    )
    for column in ("dep_delay", "arr_delay"):
        f[column] = f[column].where(f[column].between(*DELAY_RANGE))
    f["air_time"] = f["air_time"].where(f["air_time"].between(1, 1500))
    f["distance"] = f["distance"].where(f["distance"] > 0)
    day = pd.to_datetime(
        pd.DataFrame({"year": f["year"], "month": f["month"], "day": f["day"]}), errors="coerce"
    )
    usable = (
        f[["carrier", "flight", "origin", "dest", "distance"]].notna().all(axis=1)
        & hhmm_minutes(f["sched_dep_time"]).notna()
        & hhmm_minutes(f["sched_arr_time"]).notna()
        & day.notna()
    )
    f = f[usable].astype({"sched_dep_time": "int32", "sched_arr_time": "int32", "flight": "int32"})
    # the most complete row of a flight key wins: arrival known, departure known, latest departure
    f = f.assign(_a=f["arr_delay"].isna(), _d=f["dep_delay"].isna(), _t=-f["dep_time"])
    f = f.sort_values(["_a", "_d", "_t", "tailnum"], na_position="last", kind="stable")
    f = f.drop_duplicates(list(FLIGHT_KEY)).drop(columns=["_a", "_d", "_t"])
    flight = f["flight"].astype(str)
    f["flight_id"] = (
        f["date"]
        + "-"
        + f["carrier"]
        + "-"
        + flight
        + "-"
        + f["origin"]
        + "-"
        + f["sched_dep_time"].astype(str).str.zfill(4)
    )
    f["route"] = f["origin"] + "-" + f["dest"]
    return f


def add_flight_times(f: pd.DataFrame, zones: Mapping[str, str]) -> pd.DataFrame:
    """``sched_dep_ts``, ``sched_arr_ts`` (next local day when not after the departure), ``arrival_ts``;
    flights whose origin has no known zone are dropped."""
    origin_zone, dest_zone = f["origin"].map(zones), f["dest"].map(zones)
    day = pd.to_datetime(f["date"]).astype("datetime64[us]")
    dep_wall = day + pd.to_timedelta(hhmm_minutes(f["sched_dep_time"]), unit="min")
    arr_wall = day + pd.to_timedelta(hhmm_minutes(f["sched_arr_time"]), unit="min")
    dep = to_utc(dep_wall, origin_zone)
    same_day = to_utc(arr_wall, dest_zone)
    next_day = to_utc(arr_wall + pd.Timedelta(days=1), dest_zone)
    sched_arr = same_day.where(same_day > dep, next_day)
    delay = pd.to_timedelta(np.trunc(f["arr_delay"] * 60), unit="s")
    timed = f.assign(sched_dep_ts=dep, sched_arr_ts=sched_arr, arrival_ts=sched_arr + delay)
    return timed[timed["sched_dep_ts"].notna()]


def labels(f: pd.DataFrame, late_minutes: int) -> pd.DataFrame:
    arrived = f[f["arr_delay"].notna()]
    return pd.DataFrame(
        {
            "flight_id": arrived["flight_id"],
            "event_timestamp": arrived["sched_dep_ts"],
            "carrier": arrived["carrier"],
            "origin": arrived["origin"],
            "dest": arrived["dest"],
            "route": arrived["route"],
            "tailnum": arrived["tailnum"],
            "arr_delay": arrived["arr_delay"],
            "is_late": (arrived["arr_delay"] > late_minutes).astype("int32"),
            "date": arrived["date"],
        }
    )


def schedule_features(f: pd.DataFrame) -> pd.DataFrame:
    day = pd.to_datetime(f["date"])
    return pd.DataFrame(
        {
            "flight_id": f["flight_id"],
            "event_timestamp": f["sched_dep_ts"],
            "distance": f["distance"],
            "sched_dep_hour": (hhmm_minutes(f["sched_dep_time"]) // 60).astype("int32"),
            "sched_dep_weekday": ((day.dt.dayofweek + 1) % 7 + 1).astype("int32"),
            "month": f["month"].astype("int32"),
            "sched_block_minutes": (f["sched_arr_ts"] - f["sched_dep_ts"]).dt.total_seconds() / 60.0,
            "date": f["date"],
        }
    )


def hourly_grid(start_utc: dt.datetime, end_utc: dt.datetime, step_hours: int) -> np.ndarray:
    """Hours since the epoch in ``[start_utc, end_utc)`` that are multiples of ``step_hours``."""
    epoch = dt.datetime(1970, 1, 1)
    first = int((start_utc - epoch).total_seconds() // 3600)
    last = int((end_utc - epoch).total_seconds() // 3600)
    first += (-first) % step_hours
    return np.arange(first, last, step_hours, dtype="int64")


def delay_window_stats(
    f: pd.DataFrame,
    grid: np.ndarray,
    entity: str,
    window_hours: int,
    late_minutes: int,
    home_timezone: str,
) -> pd.DataFrame:
    """Trailing-window statistics per ``entity`` at every grid hour T over flights ARRIVED in
    (T - window, T] (each bucketed at the first full hour at or after its arrival)."""
    arrived = f[f["arrival_ts"].notna()]
    arrival_us = arrived["arrival_ts"].dt.as_unit("us").astype("int64").to_numpy()
    buckets = (
        pd.DataFrame(
            {
                entity: arrived[entity].to_numpy(),
                "h": -(-arrival_us // HOUR_US),
                "d": arrived["arr_delay"].to_numpy(),
                "l": (arrived["arr_delay"] > late_minutes).to_numpy().astype("int64"),
            }
        )
        .groupby([entity, "h"])
        .agg(n=("d", "size"), s=("d", "sum"), late=("l", "sum"))
        .reset_index()
    )
    stamps = pd.to_datetime(grid * 3600, unit="s", utc=True).as_unit("us")
    local = stamps.tz_convert(home_timezone).strftime("%Y-%m-%d")
    lo = min(int(grid[0]), int(buckets["h"].min()) if len(buckets) else int(grid[0])) - window_hours
    hi = int(grid[-1]) + 1
    by_entity = dict(tuple(buckets.groupby(entity)))
    frames = []
    for key in sorted(f[entity].dropna().unique()):
        sums = np.zeros((3, hi - lo + 1))
        b = by_entity.get(key)
        if b is not None:
            idx = b["h"].to_numpy() - lo + 1
            inside = idx <= hi - lo
            for row, column in enumerate(("n", "s", "late")):
                np.add.at(sums[row], idx[inside], b[column].to_numpy()[inside])
        cum = sums.cumsum(axis=1)
        t = grid - lo + 1
        n, s, late = cum[:, t] - cum[:, t - window_hours]
        some = n > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            frames.append(
                pd.DataFrame(
                    {
                        entity: key,
                        "event_timestamp": stamps,
                        f"{entity}_flights": n.round().astype("int64"),
                        f"{entity}_mean_arr_delay": np.where(some, s / np.maximum(n, 1), np.nan),
                        f"{entity}_late_share": np.where(some, late / np.maximum(n, 1), np.nan),
                        "date": local,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def clean_weather(raw: pd.DataFrame, zones: Mapping[str, str]) -> pd.DataFrame:
    """Hourly weather per origin airport: impossible readings to NaN, one row per (airport, hour)."""
    w = pd.DataFrame(
        {
            "date": raw["date"].astype(str),
            "origin": _code(raw["origin"]),
            "year": raw["year"],
            "month": raw["month"],
            "day": raw["day"],
            "hour": raw["hour"],
            **{
                c: raw[c].astype("float64").where(raw[c].astype("float64").between(*WEATHER_RANGES[c]))
                for c in WEATHER_COLUMNS
            },
        }
    )
    w = w[w["origin"].notna() & w["hour"].between(0, 23) & w["origin"].isin(list(zones))]
    day = pd.to_datetime(pd.DataFrame({"year": w["year"], "month": w["month"], "day": w["day"]}))
    wall = day.astype("datetime64[us]") + pd.to_timedelta(w["hour"] * 60, unit="min")
    w = w.assign(event_timestamp=to_utc(wall, w["origin"].map(zones)))
    # the most complete reading of an (airport, hour) wins, then the smallest values (nulls first)
    w = w.assign(_c=-w[list(WEATHER_COLUMNS)].notna().sum(axis=1))
    w = w.sort_values(["_c", *WEATHER_COLUMNS], na_position="first", kind="stable")
    w = w.drop_duplicates(["origin", "event_timestamp"])
    return w[["origin", "event_timestamp", *WEATHER_COLUMNS, "date"]]


def plane_snapshots(planes: pd.DataFrame, days: list[dt.date], starts_utc: list[dt.datetime]) -> pd.DataFrame:
    """Plane attributes as known on each day (``event_timestamp``: the UTC start of the local day)."""
    p = pd.DataFrame(
        {
            "tailnum": _code(planes["tailnum"]),
            "plane_year": planes["year"].astype("float64"),
            "seats": planes["seats"].astype("float64").where(planes["seats"].astype("float64") > 0),
            "engines": planes["engines"].astype("float64").where(planes["engines"].astype("float64") > 0),
        }
    )
    p = p[p["tailnum"].notna()].assign(_y=lambda x: -x["plane_year"])
    p = p.sort_values(["_y", "seats", "engines"], na_position="first", kind="stable")
    p = p.sort_values("_y", na_position="last", kind="stable").drop_duplicates("tailnum").drop(columns="_y")
    frames = []
    for day, start in zip(days, starts_utc, strict=True):
        valid = p["plane_year"].between(1900, day.year)
        frames.append(
            pd.DataFrame(
                {
                    "tailnum": p["tailnum"],
                    "event_timestamp": pd.Timestamp(start, tz="UTC").as_unit("us"),
                    "plane_year": p["plane_year"].where(valid),
                    "plane_age_years": (day.year - p["plane_year"]).where(valid).astype("float64"),
                    "seats": p["seats"],
                    "engines": p["engines"],
                    "date": day.isoformat(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


OUTPUT_SORT = {
    "labels": ("flight_id",),
    "flight_schedule": ("flight_id",),
    "carrier_delay_stats": ("carrier", "event_timestamp"),
    "route_delay_stats": ("route", "event_timestamp"),
    "origin_weather": ("origin", "event_timestamp"),
    "plane_attributes": ("tailnum",),
}


def flight_tables(
    raw: pd.DataFrame,
    airports: pd.DataFrame,
    start: dt.date,
    end: dt.date,
    params: FlightJobParams,
) -> dict[str, pd.DataFrame]:
    """The four flight tables of ``start..end`` from raw flights that include the look-back."""
    zones = timezones(airports, params.timezone_overrides)
    flights = add_flight_times(clean_flights(raw), zones)
    in_range = flights[flights["date"].between(start.isoformat(), end.isoformat())]
    first = common.local_midnight_utc(start, params.home_timezone)
    last = common.local_midnight_utc(end + dt.timedelta(days=1), params.home_timezone)
    tables = {"labels": labels(in_range, params.late_minutes), "flight_schedule": schedule_features(in_range)}
    for entity, hours, step in (
        ("carrier", params.carrier_window_hours, params.carrier_step_hours),
        ("route", params.route_window_hours, params.route_step_hours),
    ):
        grid = hourly_grid(first, last, step)
        tables[f"{entity}_delay_stats"] = delay_window_stats(
            flights, grid, entity, hours, params.late_minutes, params.home_timezone
        )
    return tables


def run(
    input_url: str,
    output_url: str,
    start: dt.date,
    end: dt.date,
    params: FlightJobParams,
    jobs: tuple[str, ...] = ("prepare_flights", "prepare_weather", "prepare_planes"),
) -> dict[str, int]:
    """Read the raw tables, prepare ``start..end`` and replace those dates of the prepared tables.
    Returns the rows written per table."""
    days = layout.days(start, end)
    airports = storage.read_table(storage.join(input_url, "airports"), "airports")
    tables: dict[str, pd.DataFrame] = {}
    if "prepare_flights" in jobs:
        look_back = [start - dt.timedelta(days=i) for i in range(params.lookback_days, 0, -1)]
        flights_url = storage.join(input_url, "flights")
        storage.require_partitions(flights_url, days, "flights")
        present = set(storage.list_partitions(flights_url))
        wanted = [d for d in look_back if d in present] + days
        with common.stage(f"pandas prepare_flights {start}..{end}: read"):
            raw = storage.read_partitions(flights_url, wanted, "flights")
        with common.stage(f"pandas prepare_flights {start}..{end}: transform"):
            tables |= flight_tables(raw, airports, start, end, params)
        del raw
    if "prepare_weather" in jobs:
        weather = storage.read_partitions(storage.join(input_url, "weather"), days, "weather")
        tables["origin_weather"] = clean_weather(weather, timezones(airports, params.timezone_overrides))
    if "prepare_planes" in jobs:
        planes = storage.read_table(storage.join(input_url, "planes"), "planes")
        starts = [common.local_midnight_utc(d, params.home_timezone) for d in days]
        tables["plane_attributes"] = plane_snapshots(planes, days, starts)
    written = {}
    for table, frame in tables.items():
        with common.stage(f"pandas prepare {start}..{end}: write {table}"):
            storage.write_months(frame, storage.join(output_url, table), start, end, OUTPUT_SORT[table])
        written[table] = len(frame)
    return written
