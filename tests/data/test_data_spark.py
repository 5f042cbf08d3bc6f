"""Spark preparation in local mode on a real sample: outputs, re-runs, cleaning, trailing windows."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pipelines import ingest, prepare, storage
from pipelines.flights_delay.spark_jobs import prepare_flights, transforms
from spark_jobs import common, layout

pytestmark = pytest.mark.slow

RAW_START, PREP_START, PREP_END = dt.date(2013, 1, 1), dt.date(2013, 1, 10), dt.date(2013, 1, 12)


def _read(config, table: str, days=None) -> pd.DataFrame:
    days = days or layout.days(PREP_START, PREP_END)
    frame = storage.read_partitions(storage.join(config.data_root, "prepared", table), days, table)
    frame["date"] = frame["date"].astype(str)
    return frame


def test_outputs_cover_every_date_with_unique_keys(prepared_config) -> None:
    labels = _read(prepared_config, "labels")
    assert labels["flight_id"].is_unique
    assert set(labels["date"]) == {"2013-01-10", "2013-01-11", "2013-01-12"}
    assert set(labels["is_late"]) == {0, 1}
    assert (labels["is_late"] == (labels["arr_delay"] > 15)).all()
    carriers = _read(prepared_config, "carrier_delay_stats")
    assert not carriers.duplicated(["carrier", "event_timestamp"]).any()
    # one stats row per carrier per hour of the three New York days (72 hours, no DST change in January)
    assert carriers.groupby("carrier").size().eq(72).all()
    weather = _read(prepared_config, "origin_weather")
    assert set(weather["origin"]) == {"EWR", "JFK", "LGA"}
    assert weather["wind_speed"].max() <= 150


def test_rerunning_a_date_gives_the_same_output(prepared_config, spark) -> None:
    day = [dt.date(2013, 1, 11)]
    before = {t: _read(prepared_config, t, day) for t in ("labels", "route_delay_stats", "plane_attributes")}
    config = prepared_config.replace(start_date=day[0], end_date=day[0])
    prepare.prepare(config, master="local[2]")
    for table, old in before.items():
        new = _read(prepared_config, table, day)
        keys = [c for c in new.columns if c not in ("date",)][:2]
        pd.testing.assert_frame_equal(
            old.sort_values(keys).reset_index(drop=True), new.sort_values(keys).reset_index(drop=True)
        )
    # the re-run replaced that date within its month: one data file, the other dates kept
    prepared = storage.local_path(storage.join(prepared_config.data_root, "prepared", "labels"))
    assert os.listdir(prepared) == ["date_month=2013-01"]
    assert len([f for f in os.listdir(f"{prepared}/date_month=2013-01") if f.endswith(".parquet")]) == 1
    assert set(_read(prepared_config, "labels")["date"]) == {"2013-01-10", "2013-01-11", "2013-01-12"}


def _independent_arrivals(config) -> pd.DataFrame:
    """Arrival instants computed with pandas/zoneinfo, independently of the Spark code."""
    days = layout.days(RAW_START, PREP_END)
    raw = storage.read_partitions(ingest.raw_url(config.data_root, "flights"), days, "flights")
    airports = storage.read_table(ingest.raw_url(config.data_root, "airports"), "airports")
    tz = dict(zip(airports["faa"], airports["tzone"], strict=True)) | dict(config.features.timezone_overrides)
    raw = raw[raw["arr_delay"].notna()].copy()
    local_day = pd.to_datetime(raw[["year", "month", "day"]])
    dep_wall = local_day + pd.to_timedelta(
        (raw["sched_dep_time"] // 100) * 60 + raw["sched_dep_time"] % 100, unit="min"
    )
    arr_wall = local_day + pd.to_timedelta(
        (raw["sched_arr_time"] // 100) * 60 + raw["sched_arr_time"] % 100, unit="min"
    )
    dep_utc = pd.Series(
        [
            pd.Timestamp(w).tz_localize(tz[o]).tz_convert("UTC")
            for w, o in zip(dep_wall, raw["origin"], strict=True)
        ],
        index=raw.index,
    )
    arrivals = []
    for wall, dest, dep in zip(arr_wall, raw["dest"], dep_utc, strict=True):
        arr = pd.Timestamp(wall).tz_localize(tz[dest]).tz_convert("UTC")
        if arr <= dep:  # overnight: the scheduled arrival is the next local day
            arr = (pd.Timestamp(wall) + pd.Timedelta(days=1)).tz_localize(tz[dest]).tz_convert("UTC")
        arrivals.append(arr)
    raw["arrival"] = pd.Series(arrivals, index=raw.index) + pd.to_timedelta(raw["arr_delay"], unit="min")
    raw["route"] = raw["origin"] + "-" + raw["dest"]
    return raw


@pytest.mark.parametrize(
    ("entity", "window_hours", "sample"),
    [("carrier", 24, ["UA", "B6", "EV", "WN"]), ("route", 168, ["JFK-LAX", "LGA-ATL", "EWR-ORD", "JFK-SJU"])],
)
def test_trailing_windows_match_independent_pandas(prepared_config, entity, window_hours, sample) -> None:
    flights = _independent_arrivals(prepared_config)
    stats = _read(prepared_config, f"{entity}_delay_stats")
    stats = stats[stats[entity].isin(sample)]
    stats = stats.iloc[:: 5 if entity == "carrier" else 1]  # carriers: every 5th hour; routes: every 6 h row
    assert len(stats) > 40
    window = pd.Timedelta(hours=window_hours)
    for row in stats.itertuples(index=False):
        t = row.event_timestamp
        mine = flights[
            (flights[entity] == getattr(row, entity))
            & (flights.arrival <= t)
            & (flights.arrival > t - window)
        ]
        assert getattr(row, f"{entity}_flights") == len(mine), (entity, getattr(row, entity), t)
        if len(mine):
            assert getattr(row, f"{entity}_mean_arr_delay") == pytest.approx(mine.arr_delay.mean())
            assert getattr(row, f"{entity}_late_share") == pytest.approx((mine.arr_delay > 15).mean())
        else:
            assert np.isnan(getattr(row, f"{entity}_mean_arr_delay"))


def test_a_flight_counts_only_once_it_has_arrived(spark) -> None:
    # departs 10:00 UTC, arrives 12:30 UTC (after a 30 min delay): invisible at 12:00, visible at 13:00
    flights = spark.createDataFrame(
        [("ZZ", dt.datetime(2013, 1, 10, 12, 30), 30.0), ("ZZ", dt.datetime(2013, 1, 10, 13, 0), -5.0)],
        "carrier string, arrival_ts timestamp, arr_delay double",
    )
    grid = transforms.hourly_grid(spark, dt.datetime(2013, 1, 10, 11), dt.datetime(2013, 1, 10, 15))
    out = transforms.delay_window_stats(flights, grid, "carrier", 2, 15, "carrier", "UTC").toPandas()
    by_hour = {
        ts.hour: (n, d)
        for ts, n, d in out[["event_timestamp", "carrier_flights", "carrier_mean_arr_delay"]].values
    }
    assert by_hour[11][0] == 0 and by_hour[12][0] == 0
    assert by_hour[13] == (2, 12.5)  # the 13:00 arrival counts at 13:00 (arrived by T, inclusive)
    assert by_hour[14] == (2, 12.5)
    assert set(by_hour) == {11, 12, 13, 14}


def test_cleaning_drops_impossible_rows_and_duplicates(spark) -> None:
    base = dict(
        date="2013-01-10",
        year=2013,
        month=1,
        day=10,
        dep_time=600.0,
        sched_dep_time=600,
        dep_delay=0.0,
        arr_time=900.0,
        sched_arr_time=900,
        arr_delay=5.0,
        carrier="ua",
        flight=1,
        tailnum=" N1 ",
        origin="EWR",
        dest="ORD",
        air_time=120.0,
        distance=719.0,
    )
    rows = [
        base,
        {**base, "arr_delay": None, "dep_time": 601.0},  # duplicate key, less complete: dropped
        {**base, "flight": 2, "sched_dep_time": 1275},  # minute 75: impossible clock time, dropped
        {**base, "flight": 3, "distance": -5.0},  # impossible distance, dropped
        {**base, "flight": 4, "arr_delay": 99999.0},  # impossible delay: kept, delay becomes null
        {**base, "flight": 5, "carrier": None},  # no key, dropped
    ]
    frame = spark.createDataFrame(pd.DataFrame(rows))
    clean = transforms.clean_flights(frame).toPandas().sort_values("flight")
    assert clean["flight"].tolist() == [1, 4]
    assert clean["arr_delay"].tolist()[0] == 5.0 and pd.isna(clean["arr_delay"].tolist()[1])
    assert clean["carrier"].tolist() == ["UA", "UA"] and clean["tailnum"].tolist() == ["N1", "N1"]
    assert clean["flight_id"].tolist()[0] == "2013-01-10-UA-1-EWR-0600"


def test_job_main_reports_bad_arguments(prepared_config, capsys) -> None:
    raw = storage.join(prepared_config.data_root, "raw")
    out = storage.join(prepared_config.data_root, "scratch")
    assert prepare_flights.main(["--run-date", "2013-01-32", "--input", raw, "--output", out]) == 2
    assert "--run-date: expected a date as YYYY-MM-DD, got '2013-01-32'" in capsys.readouterr().err
    assert prepare_flights.main(["--run-date", "2013-02-01", "--input", raw, "--output", out]) == 2
    assert "no partition for 1 date(s): 2013-02-01" in capsys.readouterr().err
    assert (
        prepare_flights.main(["--run-date", "2013-01-10", "--input", raw + "/nothing", "--output", out]) == 2
    )
    assert "'flights' does not exist or is empty" in capsys.readouterr().err
    assert prepare_flights.main(["--run-date", "2013-01-10", "--input", "ftp://x/y", "--output", out]) == 2
    assert "unsupported URL scheme 'ftp'" in capsys.readouterr().err
    with pytest.raises(common.JobInputError, match="--end-date 2013-01-01 is before --run-date 2013-01-10"):
        common.date_bounds(type("A", (), {"run_date": "2013-01-10", "end_date": "2013-01-01"})())


def test_spark_submit_runs_a_job(prepared_config, tmp_path) -> None:
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    command = prepare.spark_submit_commands(prepared_config, PREP_END, PREP_END, master="local[1]")[2]
    args = shlex.split(command)
    assert args[:3] == ["spark-submit", "--master", "local[1]"] and args[5].endswith("prepare_planes.py")
    out = f"file://{tmp_path}/prepared"
    args[args.index("--output") + 1] = out
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([spark_submit, *args[1:]], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    planes = pd.read_parquet(tmp_path / "prepared" / "plane_attributes")
    assert len(planes) == 3322 and set(planes["date"].astype(str)) == {"2013-01-12"}


def test_scale_up_is_seeded_and_deterministic(landed_config, spark, tmp_path) -> None:
    from pipelines.flights_delay.spark_jobs import scale_up

    # the landed tables with three of their days: the job's cost is mostly Spark's, not the rows'
    days = layout.days(RAW_START, RAW_START + dt.timedelta(days=2))
    kept = {layout.partition_name("date", d.isoformat()) for d in days}
    shutil.copytree(
        storage.local_path(storage.join(landed_config.data_root, "raw")),
        tmp_path / "raw",
        ignore=lambda _, names: [n for n in names if n.startswith("date=") and n not in kept],
    )
    raw = storage.normalize_url(str(tmp_path / "raw"))
    outs = [storage.normalize_url(str(tmp_path / name)) for name in ("a", "b")]
    rows = [scale_up.run(spark, raw, out, copies=2, seed=7, replicas=2) for out in outs]
    source = storage.read_partitions(storage.join(raw, "flights"), days, "f")
    assert sorted(source["date"].astype(str).unique()) == [d.isoformat() for d in days]
    assert rows[0] == rows[1] == 4 * len(source)
    a, b = (pd.read_parquet(tmp_path / name / "flights") for name in ("a", "b"))
    order = ["date", "carrier", "flight", "origin", "sched_dep_time"]
    a, b = (x.assign(date=x["date"].astype(str)).sort_values(order).reset_index(drop=True) for x in (a, b))
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == rows[0] and not a.duplicated(order).any()
    assert set(a["year"]) == {2013, 2014} and a["flight"].max() > 10000
    # copy 0 / replica 0 is the original data; the others are perturbed by at most 10 + 5 minutes
    original = a[(a["year"] == 2013) & (a["flight"] < 10000)].sort_values(order)
    assert original["arr_delay"].tolist() == pytest.approx(
        source.sort_values(["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time"])[
            "arr_delay"
        ].tolist(),
        nan_ok=True,
    )
    shifted = a[a["year"] == 2014].merge(
        source.assign(date=source["date"].astype(str).str.replace("2013", "2014")),
        on=order,
        suffixes=("", "_src"),
    )
    diff = (shifted["arr_delay"] - shifted["arr_delay_src"]).dropna()
    assert len(diff) > 1000 and diff.abs().max() <= 15 and diff.abs().mean() > 1
    with pytest.raises(common.JobInputError, match="--output must differ from --input"):
        scale_up.run(spark, raw, raw, copies=1, seed=1)


def test_scale_up_fills_leap_days(spark) -> None:
    from pipelines.flights_delay.spark_jobs import scale_up

    rows = spark.createDataFrame(
        [(2013, 2, 28, 0), (2013, 2, 28, 3), (2013, 3, 1, 3), (2013, 2, 28, 87)],
        "year int, month int, day int, copy long",
    )
    out = sorted(tuple(r) for r in scale_up.with_leap_days(rows).collect())
    # 2013+3 = 2016 and 2013+87 = 2100 (not leap: divisible by 100, not by 400)
    assert out == sorted(
        [(2013, 2, 28, 0), (2013, 2, 28, 3), (2013, 2, 29, 3), (2013, 3, 1, 3), (2013, 2, 28, 87)]
    )
