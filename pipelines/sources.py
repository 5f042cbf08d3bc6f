"""The data sources model pipelines read: a registry of named sources, each defined in its pipeline's folder.

A source is everything about one kind of data that the shared steps must not know: how its raw
tables land (dated ones by day, the first of them the one whose partitions announce a day;
reference tables whole), what its preparation computes from them (Spark job scripts in its folder,
the pandas engine in one process) into which prepared tables, the Feast views of those tables (a
definitions file of feature_repo/), the Great Expectations suites of its raw tables, prepared tables
and training sets, the entities of its labels, and the parameters a definition gives it (its
`features:` and `validation:` sections, models of its own). A source registers itself with
`@register` in `pipelines/<folder>/source.py`; `get(name)` imports those modules on first use, so a
new data source is a new folder, never an edit of this module or of the steps.
"""

from __future__ import annotations

import datetime as dt
import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from pipelines.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from pipelines.config import PipelineConfig

PIPELINES = Path(__file__).resolve().parent
FEATURE_REPO = PIPELINES.parent / "feature_repo"
SOURCE_MODULE = "source.py"
Expectation = Any  # a great_expectations.expectations.Expectation instance


class Parameters(BaseModel):
    """A source's `features:` or `validation:` section: immutable, and a misspelt key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


P = TypeVar("P", bound=Parameters)


def section(config: PipelineConfig, name: Literal["features", "validation"], model: type[P]) -> P:
    """A step config's `features:` or `validation:` section as its source's `model`; a config built
    for another source is refused, naming the section."""
    value = getattr(config, name)
    if not isinstance(value, model):
        raise ConfigError(f"{name}: source {config.source!r} takes its {model.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class SparkJob:
    """A Spark job of a source's preparation (`<Source.spark_jobs_dir>/<name>.py`): the raw tables it
    reads and the prepared tables it writes."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


class Source(ABC):
    """One data source. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]
    dated: ClassVar[tuple[str, ...]]
    """Raw tables landed by day (`raw/<table>/date=YYYY-MM-DD/`); the first is announced: its
    partitions are the raw asset's, and every day a run covers must have rows in it."""
    reference: ClassVar[tuple[str, ...]] = ()
    """Raw tables landed whole (`raw/<table>/data.parquet`)."""
    first_date: ClassVar[dt.date]
    last_date: ClassVar[dt.date]
    features: ClassVar[type[Parameters]] = Parameters
    validation: ClassVar[type[Parameters]] = Parameters
    spark_jobs: ClassVar[tuple[SparkJob, ...]] = ()
    """Empty: the source prepares with pandas only (a definition must say `spark.engine: pandas`)."""
    spark_jobs_dir: ClassVar[Path | None] = None
    """The folder of its Spark jobs' scripts, `<name>.py` each (spark-submit runs them as files)."""
    prepared: ClassVar[tuple[str, ...]]
    """Every prepared table, the labels (`prepared/labels`) first."""
    feature_views: ClassVar[str]
    """Its Feast definitions: a file of feature_repo/ (rendered as the repository's definitions.py)."""
    key_column: ClassVar[str]
    """A label's unique id: a training set's rows are keyed by it and `event_timestamp`."""
    entity_columns: ClassVar[tuple[str, ...]]
    """The labels' columns Feast joins the views on (the key first)."""
    served_after: ClassVar[dt.timedelta] = dt.timedelta(hours=6)
    """How long after midnight UTC ending a day every feature row of that day is stamped (a run
    materializes up to then)."""
    binary_label: ClassVar[bool] = True
    """Its labels are 0/1 (a classifier's); else values (a regressor's)."""
    entity_fill: ClassVar[Mapping[str, str]] = {}
    """A value for entity keys a label lacks (a join key cannot be null)."""

    @abstractmethod
    def load(self) -> dict[str, pd.DataFrame]:
        """Every raw table as the source ships it; the dated ones with a `date` column (the day, a date)."""

    def lookback_days(self, features: Any) -> int:
        """Raw days before the first prepared day that the preparation reads, with these `features`."""
        return 0

    def spark_arguments(self, config: PipelineConfig, job: str) -> list[str]:
        """A Spark job's arguments beyond the common ones (dates, input, output, shuffle partitions)."""
        return []

    def run_spark(self, spark: Any, job: str, run: Any, config: PipelineConfig) -> None:
        """Run Spark job `job` in `spark` for `run` (spark_jobs.common.JobRun), in this process."""
        raise ConfigError(f"source {self.name!r} has no Spark job {job!r}")

    @abstractmethod
    def prepare_pandas(
        self, config: PipelineConfig, raw: str, prepared: str, start: dt.date, end: dt.date
    ) -> dict[str, int]:
        """Prepare the days `start..end` with pandas (every prepared table); the rows written per table."""

    @abstractmethod
    def raw_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        """The expectations of each dated raw table over `start..end`."""

    @abstractmethod
    def feature_suites(
        self, config: PipelineConfig, start: dt.date, end: dt.date
    ) -> dict[str, list[Expectation]]:
        """The expectations of each prepared table (the labels too) over `start..end`."""

    @abstractmethod
    def training_set_suite(self, feature_columns: Sequence[str], label: str) -> list[Expectation]:
        """The expectations of a training set it feeds."""

    @abstractmethod
    def label_definition(self, config: PipelineConfig) -> str:
        """What the label means, in words (a training set's manifest says it)."""

    @property
    def announced(self) -> str:
        return self.dated[0]

    @property
    def feature_views_file(self) -> Path:
        return FEATURE_REPO / self.feature_views

    def job_script(self, name: str) -> Path:
        """The file spark-submit runs for Spark job `name`."""
        job = self.job(name)
        if self.spark_jobs_dir is None:
            raise ConfigError(f"source {self.name!r} names no folder of its Spark jobs (spark_jobs_dir)")
        return self.spark_jobs_dir / f"{job.name}.py"

    def job(self, name: str) -> SparkJob:
        for job in self.spark_jobs:
            if job.name == name:
                return job
        raise ConfigError(
            f"source {self.name!r} has no Spark job {name!r}; its jobs: {[j.name for j in self.spark_jobs]}"
        )


SOURCES: dict[str, Source] = {}


def register(cls: type[Source]) -> type[Source]:
    """Class decorator: add a source to the registry under its `name`."""
    if cls.name in SOURCES and type(SOURCES[cls.name]) is not cls:
        raise ConfigError(f"data source {cls.name!r} is defined twice: {type(SOURCES[cls.name])} and {cls}")
    SOURCES[cls.name] = cls()
    return cls


def _discover() -> None:
    """Import every pipeline folder's source module (each registers its source)."""
    for module in sorted(PIPELINES.glob(f"*/{SOURCE_MODULE}")):
        importlib.import_module(f"pipelines.{module.parent.name}.{module.stem}")


def get(name: str) -> Source:
    """The source registered as `name`; the error lists those there are."""
    if name not in SOURCES:
        _discover()
    if name not in SOURCES:
        raise ConfigError(f"data.source: no data source {name!r}; sources: {sorted(SOURCES)}")
    return SOURCES[name]


def of(config: PipelineConfig) -> Source:
    """The source a step config reads."""
    return get(config.source)
