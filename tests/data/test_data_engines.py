"""The preparation engines: Spark and pandas give the same tables row for row on the real data (also across
a DST change), the tables are laid out by month, and `engine: auto` picks by the rows a run reads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines import ingest, prepare, storage
from pipelines.errors import ConfigError
from pipelines.flights_delay import prepare_pandas
from pipelines.flights_delay.source import flight_params
from spark_jobs import layout

pytestmark = pytest.mark.slow

KEYS = {
    "labels": ["flight_id"],
    "flight_schedule": ["flight_id"],
    "carrier_delay_stats": ["carrier", "event_timestamp"],
    "route_delay_stats": ["route", "event_timestamp"],
    "origin_weather": ["origin", "event_timestamp"],
    "plane_attributes": ["tailnum", "date"],
}


def _assert_same_tables(spark_root: str, pandas_root: str, days: list[dt.date]) -> int:
    compared = 0
    for table, key in KEYS.items():
        urls = [storage.join(root, table) for root in (spark_root, pandas_root)]
        files = [next(Path(storage.local_path(u)).rglob("*.parquet")) for u in urls]
        spark_types, pandas_types = ([(f.name, f.type) for f in pq.read_schema(file)] for file in files)
        assert spark_types == pandas_types, table
        spark, pandas = (
            storage.read_partitions(u, days, table).sort_values(key).reset_index(drop=True) for u in urls
        )
        assert len(spark) > 0, table
        pd.testing.assert_frame_equal(spark, pandas, check_exact=False, rtol=1e-12, obj=table)
        compared += len(spark)
    return compared


def test_spark_and_pandas_give_the_same_tables(prepared_config, tmp_path) -> None:
    days = layout.days(prepared_config.start_date, prepared_config.end_date)
    out = storage.normalize_url(str(tmp_path / "prepared"))
    raw = storage.join(prepared_config.data_root, "raw")
    prepare_pandas.run(raw, out, days[0], days[-1], flight_params(prepared_config))
    assert _assert_same_tables(storage.join(prepared_config.data_root, "prepared"), out, days) > 15_000
    labels = storage.local_path(storage.join(out, "labels"))
    assert sorted(p.name for p in Path(labels).iterdir()) == ["date_month=2013-01"]


def test_the_engines_agree_across_the_spring_dst_change(landed_config, spark, tmp_path) -> None:
    # New York moved its clocks on 2013-03-10: 02:00-03:00 local does not exist that night
    root = storage.normalize_url(str(tmp_path))
    config = landed_config.replace(
        data_root=root, start_date=dt.date(2013, 3, 9), end_date=dt.date(2013, 3, 11), engine="spark"
    )
    ingest.ingest(config.replace(start_date=dt.date(2013, 3, 1)))
    prepare.prepare(config, master="local[2]")
    out = storage.join(root, "pandas")
    prepare_pandas.run(
        storage.join(root, "raw"), out, config.start_date, config.end_date, flight_params(config)
    )
    days = layout.days(config.start_date, config.end_date)
    assert _assert_same_tables(storage.join(root, "prepared"), out, days)
    carriers = storage.read_partitions(
        storage.join(root, "prepared", "carrier_delay_stats"), [dt.date(2013, 3, 10)], "carrier_delay_stats"
    )
    assert carriers.groupby("carrier").size().eq(23).all()  # a 23-hour local day


def test_auto_picks_the_engine_by_the_rows_a_run_reads(landed_config) -> None:
    start = end = dt.date(2013, 1, 12)
    rows = prepare.expected_rows(landed_config, start, end)
    first, last = prepare.read_days(landed_config, start, end)
    raw = storage.read_partitions(
        ingest.raw_url(landed_config.data_root, "flights"),
        layout.days(max(first, dt.date(2013, 1, 1)), last),
        "f",
    )
    assert rows == len(raw) > 5_000
    assert prepare.resolve_engine(landed_config.replace(spark_from_rows=rows), start, end) == ("spark", rows)
    assert prepare.resolve_engine(landed_config.replace(spark_from_rows=rows + 1), start, end) == (
        "pandas",
        rows,
    )
    assert prepare.resolve_engine(landed_config.replace(engine="pandas", spark_from_rows=0), start, end)[
        0
    ] == ("pandas")
    assert prepare.choose_engine("spark", 0, 10**9) == "spark"
    with pytest.raises(ConfigError, match=r"spark\.engine: expected one of"):
        prepare.choose_engine("dask", 1, 1)
