"""Bad inputs give errors that name what is wrong: dates, URLs, settings, tables, partitions."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from pipelines import ingest, storage
from pipelines.config import parse_date
from pipelines.definition import load_config, load_definition
from pipelines.errors import ConfigError, MissingDataError
from pipelines.flights_delay.source import Nycflights13


def test_default_definition_loads_and_is_readable() -> None:
    config = load_config()
    assert config.label_column == "is_late"
    assert config.feature_service == "flight_delay_v1"
    assert config.start_date == dt.date(2013, 1, 1)
    assert config.data_root.startswith("file:///")
    assert config.features.timezone_overrides["SJU"] == "America/Puerto_Rico"


@pytest.mark.parametrize("value", ["2013-13-01", "yesterday", "", None, 20130101])
def test_bad_date_names_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"start_date: expected a date as YYYY-MM-DD"):
        parse_date(value, "start_date")


def test_bad_date_in_overrides() -> None:
    with pytest.raises(ConfigError, match=r"end_date.*'2013-02-30'"):
        load_config(end_date="2013-02-30")


def test_end_before_start() -> None:
    with pytest.raises(ConfigError, match="end_date 2013-01-01 is before start_date 2013-01-05"):
        load_config(start_date="2013-01-05", end_date="2013-01-01")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nosuchscheme://bucket/x", "unknown URL scheme 'nosuchscheme'"),
        ("", "expected a non-empty fsspec URL"),
        ("file://otherhost/x", "must be file:///absolute/path"),
    ],
)
def test_bad_url_names_the_problem(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(data_root=url or " ")


def test_local_paths_and_file_urls_normalize(tmp_path: Path) -> None:
    assert storage.normalize_url(str(tmp_path)) == f"file://{tmp_path}"
    assert storage.normalize_url(f"file://{tmp_path}/") == f"file://{tmp_path}"
    assert storage.normalize_url("memory://bucket/x/") == "memory://bucket/x"


def test_unknown_setting_is_refused(tmp_path: Path) -> None:
    text = load_definition("flights_delay").path.read_text()
    (tmp_path / "pipeline.yaml").write_text(text.replace("late_after_minutes:", "late_after_minuts:"))
    with pytest.raises(ConfigError, match=r"features.late_after_minuts: Extra inputs are not permitted"):
        load_definition(tmp_path / "pipeline.yaml")


def test_a_run_date_the_source_cannot_cover_is_refused() -> None:
    definition = load_definition("flights_delay")
    assert definition.window("2013-01-21").train_start == dt.date(2013, 1, 8)
    with pytest.raises(ConfigError, match=r"run_date 2013-01-10: the source covers 2013-01-01..2013-12-31"):
        definition.window("2013-01-10")
    with pytest.raises(ConfigError, match="run_date: expected a date"):
        definition.window("soon")


def test_missing_definition_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_missing_partition_names_table_and_dates(tmp_path: Path) -> None:
    table = storage.normalize_url(str(tmp_path / "raw" / "flights"))
    storage.write_partition(pd.DataFrame({"a": [1]}), table, dt.date(2013, 1, 1))
    with pytest.raises(MissingDataError, match=r"'flights'.*2013-01-02, 2013-01-03"):
        storage.require_partitions(table, [dt.date(2013, 1, d) for d in (1, 2, 3)], "flights")


def test_missing_reference_table(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match="table 'planes' does not exist"):
        storage.read_table(storage.normalize_url(str(tmp_path / "raw" / "planes")), "planes")


def test_ingest_refuses_dates_the_source_lacks(tmp_path: Path) -> None:
    config = load_config(data_root=str(tmp_path), start_date="2014-01-01", end_date="2014-01-02")
    with pytest.raises(MissingDataError, match="no flights for 2 requested date"):
        ingest.ingest(config)


def test_ingest_refuses_missing_source_table(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match=r"source tables \['weather'"):
        ingest.land_tables(
            Nycflights13(),
            {"flights": pd.DataFrame()},
            str(tmp_path),
            dt.date(2013, 1, 1),
            dt.date(2013, 1, 1),
        )
