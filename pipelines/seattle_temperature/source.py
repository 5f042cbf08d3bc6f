"""The `seattle_weather` data source: Seattle's daily weather 2012-2015, shipped inside ``vega_datasets``.

Raw: one observation a day (`observations`, landed by its local day): precipitation (mm), the day's
highest and lowest temperature (C), mean wind (m/s) and the weather's kind. Prepared, with pandas (a
row a day needs no Spark; prepare_pandas.py):

- `daily_weather`, the features known at the end of local day D (stamped at the local midnight that
  ends it): the day's values, their means (precipitation: its sum) over the `window_days` ending D,
  the change of the maximum since D - 1 and the season of the next day (the sine and cosine of its
  day of the year);
- `labels`, one per target day D: `next_temp_max`, D's highest temperature, forecast at the local
  midnight that starts D, so the point-in-time join gives it D - 1's features and never D's own.

Its Feast views are feature_repo/seattle_weather.py; the station is the entity (`SEA`).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from pipelines.config import PipelineConfig
from pipelines.errors import MissingDataError
from pipelines.sources import Expectation, Parameters, Source, register, section

if TYPE_CHECKING:
    import pandas as pd


class Features(Parameters):
    window_days: int = Field(7, ge=1, le=60, description="the days the means and the sum reach back over")


class Validation(Parameters):
    min_temp_c: float = Field(-25.0, description="the lowest temperature a raw day may report")
    max_temp_c: float = Field(45.0, description="the highest")
    max_precipitation_mm: float = Field(150.0, gt=0, description="the most rain a raw day may report")


def weather_features(config: PipelineConfig) -> Features:
    return section(config, "features", Features)


def weather_bounds(config: PipelineConfig) -> Validation:
    return section(config, "validation", Validation)


def data_file() -> Path:
    """The CSV the package ships, found without importing it."""
    spec = importlib.util.find_spec("vega_datasets")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError("the 'vega_datasets' package is not installed; install the pipeline extra")
    file = Path(next(iter(spec.submodule_search_locations))) / "_data" / "seattle-weather.csv"
    if not file.is_file():
        raise MissingDataError(f"vega_datasets' Seattle weather is missing: {file} does not exist")
    return file


@register
class SeattleWeather(Source):
    name = "seattle_weather"
    dated = ("observations",)
    first_date = dt.date(2012, 1, 1)
    last_date = dt.date(2015, 12, 31)
    features = Features
    validation = Validation
    prepared = ("labels", "daily_weather")
    feature_views = "seattle_weather.py"
    key_column = "forecast_id"
    entity_columns = ("forecast_id", "station")
    binary_label = False
    served_after = dt.timedelta(hours=9)  # local midnight is 08:00 UTC in winter, 07:00 in summer

    def load(self) -> dict[str, pd.DataFrame]:
        import pandas as pd

        frame = pd.read_csv(data_file())
        frame["date"] = pd.to_datetime(frame["date"], format="%Y/%m/%d").dt.date
        return {"observations": frame}

    def lookback_days(self, features: Any) -> int:
        return int(features.window_days)  # the window before the first day, and its day before

    def prepare_pandas(
        self, config: PipelineConfig, raw: str, prepared: str, start: dt.date, end: dt.date
    ) -> dict[str, int]:
        from pipelines.seattle_temperature import prepare_pandas

        return prepare_pandas.run(raw, prepared, start, end, weather_features(config).window_days)

    def raw_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        from pipelines.seattle_temperature import suites

        return {"observations": suites.raw_observations(weather_bounds(config), start, end)}

    def feature_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        from pipelines.seattle_temperature import suites

        return suites.features(weather_bounds(config), start, end)

    def training_set_suite(self, feature_columns: Sequence[str], label: str) -> list[Expectation]:
        from pipelines.seattle_temperature import suites

        return suites.training_set(feature_columns, label)

    def label_definition(self, config: PipelineConfig) -> str:
        return (
            "the next day's highest temperature in Seattle, degrees C, forecast at the local midnight before"
        )
