"""Raw landing: parquet partitions per date under an fsspec root, idempotent per partition."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from pipelines import ingest, storage
from pipelines.flights_delay.source import Nycflights13, load_table


def test_landed_partitions_match_the_source(landed_config) -> None:
    flights_url = ingest.raw_url(landed_config.data_root, "flights")
    days = storage.list_partitions(flights_url)
    assert days == [dt.date(2013, 1, d) for d in range(1, 13)]
    source = load_table("flights")
    expected = source[(source.year == 2013) & (source.month == 1) & (source.day == 5)]
    landed = storage.read_partitions(flights_url, [dt.date(2013, 1, 5)], "flights")
    assert len(landed) == len(expected) > 500
    assert set(landed["day"]) == {5}
    assert len(storage.read_table(ingest.raw_url(landed_config.data_root, "planes"), "planes")) == 3322


def test_relanding_a_date_replaces_it(tmp_path) -> None:
    root = storage.normalize_url(str(tmp_path))
    flights = Nycflights13()
    tables = flights.load()
    day = dt.date(2013, 1, 3)
    first = ingest.land_tables(flights, tables, root, day, day)
    again = ingest.land_tables(flights, tables, root, day, day)
    assert first.rows == again.rows
    flights_url = ingest.raw_url(root, "flights")
    landed = storage.read_partitions(flights_url, [day], "flights")
    assert len(landed) == first.rows["flights"]
    part_dir = tmp_path / "raw" / "flights" / "date=2013-01-03"
    assert [p.name for p in part_dir.iterdir()] == ["part-00000.parquet"]
    # no staging leftovers beside the partitions
    assert sorted(p.name for p in (tmp_path / "raw" / "flights").iterdir()) == ["date=2013-01-03"]


def test_memory_filesystem_root() -> None:
    root = "memory://gpuyard-test/flights"
    frame = pd.DataFrame({"x": [1, 2, 3]})
    storage.write_partition(frame, storage.join(root, "t"), dt.date(2013, 1, 1))
    storage.write_partition(frame.head(1), storage.join(root, "t"), dt.date(2013, 1, 1))
    back = storage.read_partitions(storage.join(root, "t"), [dt.date(2013, 1, 1)], "t")
    assert back["x"].tolist() == [1]


def test_a_corrected_day_is_kept_as_its_producer_relanded_it(tmp_path) -> None:
    root = storage.normalize_url(str(tmp_path))
    flights = Nycflights13()
    tables = flights.load()
    first, day = dt.date(2013, 1, 2), dt.date(2013, 1, 3)
    ingest.land_tables(flights, tables, root, first, day)
    flights_url = ingest.raw_url(root, "flights")
    corrected = storage.read_partitions(flights_url, [day], "flights").head(7)
    storage.write_partition(corrected, flights_url, day)
    ingest.land_tables(flights, tables, root, first, day, keep=[day])
    assert len(storage.read_partitions(flights_url, [day], "flights")) == 7
    assert len(storage.read_partitions(flights_url, [first], "flights")) > 500  # landed again as usual
