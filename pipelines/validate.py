"""Validation step: Great Expectations 1.x suites for the raw tables, the feature tables and the training set.

Each suite is a list of expectations built from the pipeline config (schema, nulls, ranges, key uniqueness,
freshness, row-count bounds). :func:`run_suite` validates a pandas DataFrame through a file Data Context
under ``<data_root>/reports/gx/`` laid out as Great Expectations lays it out: the suite in
``expectations/``, its validation definition and checkpoint in ``validation_definitions/`` and
``checkpoints/``, the results and the Data Docs site in ``uncommitted/`` (the checkpoint's
UpdateDataDocsAction renders them). It raises :class:`ValidationFailed` naming every failing
expectation with example values, which stops the pipeline; the report URL is the run's Data Docs page.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pipelines import ingest, storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, ValidationFailed
from spark_jobs import layout

log = logging.getLogger(__name__)

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
logging.getLogger("great_expectations").setLevel(logging.WARNING)

Expectation = Any  # a great_expectations.expectations.Expectation instance
FEATURE_TABLES = (
    "flight_schedule",
    "carrier_delay_stats",
    "route_delay_stats",
    "origin_weather",
    "plane_attributes",
)


@dataclass(frozen=True)
class SuiteReport:
    """Outcome of one suite on one batch."""

    suite: str
    success: bool
    evaluated: int
    failures: tuple[str, ...]
    report_url: str


def _gxe() -> Any:
    import great_expectations.expectations as gxe

    return gxe


def _utc(value: dt.datetime) -> pd.Timestamp:
    return pd.Timestamp(value).tz_localize("UTC") if value.tzinfo is None else pd.Timestamp(value)


def _day_window_utc(start: dt.date, end: dt.date) -> tuple[pd.Timestamp, pd.Timestamp]:
    """UTC bounds of the local (New York) days ``start..end``, with an hour of slack each side."""
    first = pd.Timestamp(start).tz_localize("America/New_York").tz_convert("UTC") - pd.Timedelta(hours=1)
    last = pd.Timestamp(end + dt.timedelta(days=1)).tz_localize("America/New_York").tz_convert("UTC")
    return first, last + pd.Timedelta(hours=1)


def _dates(start: dt.date, end: dt.date) -> list[str]:
    return [d.isoformat() for d in pd.date_range(start, end, freq="D").date]


# ---------------------------------------------------------------- suites


def raw_flights_suite(config: PipelineConfig, start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = _gxe()
    days = (end - start).days + 1
    columns = [
        "year",
        "month",
        "day",
        "sched_dep_time",
        "sched_arr_time",
        "carrier",
        "flight",
        "origin",
        "dest",
    ]
    return [
        *(
            gxe.ExpectColumnToExist(column=c)
            for c in (*columns, "dep_delay", "arr_delay", "tailnum", "distance")
        ),
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in columns),
        gxe.ExpectColumnValuesToBeBetween(column="sched_dep_time", min_value=0, max_value=2400),
        gxe.ExpectColumnValuesToBeBetween(column="month", min_value=1, max_value=12),
        gxe.ExpectColumnValuesToBeBetween(column="distance", min_value=1, max_value=6000),
        gxe.ExpectColumnValuesToBeBetween(column="dep_delay", min_value=-240, max_value=2880, mostly=0.999),
        gxe.ExpectColumnValuesToBeBetween(column="arr_delay", min_value=-240, max_value=2880, mostly=0.999),
        gxe.ExpectColumnValuesToMatchRegex(column="origin", regex=r"^[A-Z0-9]{3}$"),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time"]
        ),
        gxe.ExpectTableRowCountToBeBetween(
            min_value=config.min_flights_per_day * days, max_value=config.max_flights_per_day * days
        ),
        # freshness: every requested date has landed
        gxe.ExpectColumnDistinctValuesToContainSet(column="date", value_set=_dates(start, end)),
    ]


def raw_weather_suite(config: PipelineConfig, start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = _gxe()
    days = (end - start).days + 1
    return [
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("origin", "year", "month", "day", "hour")),
        gxe.ExpectColumnValuesToBeBetween(column="hour", min_value=0, max_value=23),
        gxe.ExpectColumnValuesToBeBetween(column="temp", min_value=-60, max_value=130, mostly=0.99),
        gxe.ExpectColumnValuesToBeBetween(column="humid", min_value=0, max_value=100, mostly=0.99),
        gxe.ExpectColumnValuesToBeBetween(column="wind_speed", min_value=0, max_value=150, mostly=0.99),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["origin", "year", "month", "day", "hour"]),
        gxe.ExpectTableRowCountToBeBetween(min_value=24 * days, max_value=24 * 10 * days),
        gxe.ExpectColumnDistinctValuesToContainSet(column="date", value_set=_dates(start, end)),
    ]


def _feature_common(
    keys: Sequence[str], start: dt.date, end: dt.date, min_rows: int, max_rows: int
) -> list[Expectation]:
    gxe = _gxe()
    first, last = _day_window_utc(start, end)
    return [
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in (*keys, "event_timestamp")),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=[*keys, "event_timestamp"]),
        gxe.ExpectColumnMinToBeBetween(column="event_timestamp", min_value=first, max_value=last),
        # freshness: the newest row belongs to the last requested day
        gxe.ExpectColumnMaxToBeBetween(
            column="event_timestamp", min_value=last - pd.Timedelta(hours=26), max_value=last
        ),
        gxe.ExpectTableRowCountToBeBetween(min_value=min_rows, max_value=max_rows),
    ]


def feature_suite(table: str, config: PipelineConfig, start: dt.date, end: dt.date) -> list[Expectation]:
    gxe = _gxe()
    days = (end - start).days + 1
    between = gxe.ExpectColumnValuesToBeBetween
    if table == "labels":
        return [
            *_feature_common(["flight_id"], start, end, days * 10, days * config.max_flights_per_day),
            *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("carrier", "origin", "route", "is_late")),
            gxe.ExpectColumnValuesToBeInSet(column="is_late", value_set=[0, 1]),
            gxe.ExpectColumnValuesToBeUnique(column="flight_id"),
        ]
    if table == "flight_schedule":
        return [
            *_feature_common(["flight_id"], start, end, days * 10, days * config.max_flights_per_day),
            between(column="distance", min_value=1, max_value=6000),
            between(column="sched_dep_hour", min_value=0, max_value=24),
            between(column="sched_dep_weekday", min_value=1, max_value=7),
            between(column="month", min_value=1, max_value=12),
            between(column="sched_block_minutes", min_value=10, max_value=24 * 60, mostly=0.999),
        ]
    if table in ("carrier_delay_stats", "route_delay_stats"):
        entity = table.split("_", 1)[0]
        return [
            *_feature_common([entity], start, end, days * 3, days * 25 * 5000),
            between(column=f"{entity}_flights", min_value=0, max_value=100_000),
            between(column=f"{entity}_late_share", min_value=0, max_value=1),
            between(column=f"{entity}_mean_arr_delay", min_value=-240, max_value=2880),
        ]
    if table == "origin_weather":
        return [
            *_feature_common(["origin"], start, end, days * 20, days * 25 * 10),
            between(column="temp", min_value=-60, max_value=130),
            between(column="humid", min_value=0, max_value=100),
            between(column="wind_speed", min_value=0, max_value=150),
            between(column="visib", min_value=0, max_value=100),
            gxe.ExpectColumnProportionOfNonNullValuesToBeBetween(column="temp", min_value=0.9),
        ]
    if table == "plane_attributes":
        return [
            *_feature_common(["tailnum"], start, end, days, days * 100_000),
            between(column="plane_age_years", min_value=0, max_value=100),
            between(column="seats", min_value=1, max_value=1000),
        ]
    raise ValueError(f"no validation suite for table {table!r}; expected labels or one of {FEATURE_TABLES}")


def training_set_suite(
    feature_columns: Sequence[str], label: str, min_rows: int = 1, max_rows: int = 100_000_000
) -> list[Expectation]:
    gxe = _gxe()
    return [
        gxe.ExpectColumnValuesToBeUnique(column="flight_id"),
        gxe.ExpectColumnValuesToNotBeNull(column=label),
        gxe.ExpectColumnValuesToBeInSet(column=label, value_set=[0, 1]),
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in feature_columns),
        gxe.ExpectColumnValuesToBeBetween(column="carrier_late_share", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="route_late_share", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="distance", min_value=1, max_value=6000),
        gxe.ExpectTableRowCountToBeBetween(min_value=min_rows, max_value=max_rows),
    ]


# ---------------------------------------------------------------- running


def _describe(result: Any) -> str:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k not in ("batch_id", "result_format")}
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    res = result.result or {}
    if "unexpected_count" in res:
        examples = res.get("partial_unexpected_list") or []
        shown = ", ".join(repr(e) for e in examples[:5])
        return (
            f"{config.type}({args}): {res['unexpected_count']} of {res.get('element_count')} rows "
            f"unexpected, e.g. [{shown}]"
        )
    if "observed_value" in res:
        observed = res["observed_value"]
        if isinstance(observed, list) and len(observed) > 10:
            observed = [*observed[:10], "..."]
        return f"{config.type}({args}): observed {observed!r}"
    if result.exception_info and result.exception_info.get("raised_exception"):
        return f"{config.type}({args}): raised {result.exception_info.get('exception_message')}"
    return f"{config.type}({args}): failed"


def gx_root(data_root: str) -> str:
    """The local folder of the data root's Great Expectations project (a file Data Context needs one)."""
    reports = storage.join(data_root, "reports")
    if not storage.is_local(reports):
        raise ConfigError(
            f"validation reports: Great Expectations' file Data Context needs a local folder; "
            f"the data root {data_root!r} is not local"
        )
    return storage.local_path(reports)


def _batch(context: Any, suite_name: str) -> Any:
    """The whole-DataFrame batch definition of the suite's asset (created on first use)."""
    try:
        source = context.data_sources.get("pipeline")
    except KeyError:
        source = context.data_sources.add_pandas("pipeline")
    try:
        asset = source.get_asset(suite_name)
    except LookupError:
        asset = source.add_dataframe_asset(suite_name)
    try:
        return asset.get_batch_definition("whole")
    except KeyError:
        return asset.add_batch_definition_whole_dataframe("whole")


def run_suite(
    suite_name: str, frame: pd.DataFrame, expectations: Sequence[Expectation], context_root: str
) -> SuiteReport:
    """Validate ``frame`` through the suite's checkpoint in the file Data Context at ``context_root``
    (Data Docs updated); raise on failure."""
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=context_root)
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    suite = gx.ExpectationSuite(name=suite_name)
    for expectation in expectations:
        copied = expectation.copy(deep=True)  # an expectation belongs to one suite: add a fresh copy
        copied.id = None
        suite.add_expectation(copied)
    suite = context.suites.add_or_update(suite)
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite_name, data=_batch(context, suite_name), suite=suite)
    )
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=suite_name,
            validation_definitions=[definition],
            actions=[UpdateDataDocsAction(name="data_docs")],
            result_format="SUMMARY",
        )
    )
    outcome = checkpoint.run(batch_parameters={"dataframe": frame})
    [(identifier, result)] = outcome.run_results.items()
    [page] = context.get_docs_sites_urls(resource_identifier=identifier)
    failures = tuple(_describe(r) for r in result.results if not r.success)
    report = SuiteReport(suite_name, bool(result.success), len(result.results), failures, page["site_url"])
    log.info(
        "validation %s: %s (%d expectations) -> %s",
        suite_name,
        result.success,
        len(result.results),
        report.report_url,
    )
    if not result.success:
        raise ValidationFailed(suite_name, list(failures), report.report_url)
    return report


def _validate_tables(
    config: PipelineConfig,
    start: dt.date,
    end: dt.date,
    tables: Sequence[tuple[str, str, Callable[[], list[Expectation]]]],
) -> list[SuiteReport]:
    reports = []
    for suite_name, table_url, build in tables:
        frame = storage.read_partitions(table_url, layout.days(start, end), suite_name.split(".", 1)[-1])
        frame["date"] = frame["date"].astype(str)
        reports.append(run_suite(suite_name, frame, build(), gx_root(config.data_root)))
    return reports


def validate_raw(
    config: PipelineConfig, start: dt.date | None = None, end: dt.date | None = None
) -> list[SuiteReport]:
    """The Airflow-callable step: raw ``flights`` and ``weather`` of ``start..end``."""
    start, end = start or config.start_date, end or config.end_date
    return _validate_tables(
        config,
        start,
        end,
        [
            (
                "raw.flights",
                ingest.raw_url(config.data_root, "flights"),
                lambda: raw_flights_suite(config, start, end),
            ),
            (
                "raw.weather",
                ingest.raw_url(config.data_root, "weather"),
                lambda: raw_weather_suite(config, start, end),
            ),
        ],
    )


def prepared_url(data_root: str, table: str) -> str:
    return storage.join(data_root, "prepared", table)


def validate_features(
    config: PipelineConfig, start: dt.date | None = None, end: dt.date | None = None
) -> list[SuiteReport]:
    """The Airflow-callable step: the labels and every feature table of ``start..end``."""
    start, end = start or config.start_date, end or config.end_date
    tables = [
        (
            f"features.{table}",
            prepared_url(config.data_root, table),
            (lambda t=table: feature_suite(t, config, start, end)),
        )
        for table in ("labels", *FEATURE_TABLES)
    ]
    return _validate_tables(config, start, end, tables)


def validate_training_set(manifest_url: str) -> SuiteReport:
    """The Airflow-callable step: the training-set suite on what the training-set step wrote."""
    import json

    fs, path = storage.filesystem(manifest_url)
    with fs.open(path) as handle:
        manifest = json.load(handle)
    folder = manifest_url.rsplit("/", 1)[0]
    _, data_path = storage.filesystem(storage.join(folder, manifest["data_file"]))
    with fs.open(data_path, "rb") as handle:
        frame = pd.read_parquet(handle)
    return run_suite(
        "training_set",
        frame,
        training_set_suite(manifest["feature_columns"], manifest["label_column"]),
        gx_root(manifest["data_root"]),
    )
