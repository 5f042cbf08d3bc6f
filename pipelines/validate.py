"""Validation step: Great Expectations 1.x suites for the raw tables, the feature tables and the training set.

Each suite is a list of expectations its data source builds (pipelines/sources.py: schema, nulls, ranges,
key uniqueness, freshness, row-count bounds), from the helpers here. :func:`run_suite` validates a
pandas DataFrame through a file Data Context under ``<data_root>/reports/gx/`` laid out as Great
Expectations lays it out: the suite in
``expectations/``, its validation definition and checkpoint in ``validation_definitions/`` and
``checkpoints/``, the results and the Data Docs site in ``uncommitted/`` (the checkpoint's
UpdateDataDocsAction renders them). It raises :class:`ValidationFailed` naming every failing
expectation with example values, which stops the pipeline; the report URL is the run's Data Docs page.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pipelines import ingest, sources, storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, ValidationFailed
from spark_jobs import layout

log = logging.getLogger(__name__)

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
logging.getLogger("great_expectations").setLevel(logging.WARNING)

Expectation = Any  # a great_expectations.expectations.Expectation instance


@dataclass(frozen=True)
class SuiteReport:
    """Outcome of one suite on one batch."""

    suite: str
    success: bool
    evaluated: int
    failures: tuple[str, ...]
    report_url: str


def expectations() -> Any:
    """Great Expectations' expectations module (imported when a suite is built, never before)."""
    import great_expectations.expectations as gxe

    return gxe


def day_window_utc(start: dt.date, end: dt.date, timezone: str) -> tuple[pd.Timestamp, pd.Timestamp]:
    """UTC bounds of the local days ``start..end`` in ``timezone``, with an hour of slack each side."""
    first = pd.Timestamp(start).tz_localize(timezone).tz_convert("UTC") - pd.Timedelta(hours=1)
    last = pd.Timestamp(end + dt.timedelta(days=1)).tz_localize(timezone).tz_convert("UTC")
    return first, last + pd.Timedelta(hours=1)


def dates(start: dt.date, end: dt.date) -> list[str]:
    """The days ``start..end`` as the ``date`` column holds them (freshness: every one landed)."""
    return [d.isoformat() for d in pd.date_range(start, end, freq="D").date]


def feature_table(
    keys: Sequence[str],
    start: dt.date,
    end: dt.date,
    rows: tuple[int, int],
    timezone: str,
    fresh_hours: int = 26,
) -> list[Expectation]:
    """What every prepared table keeps: keys and timestamps present, one row per key and time, the
    times within the local days ``start..end`` and the newest of the last day (within ``fresh_hours``
    of its end), and ``rows`` (min, max) rows."""
    gxe = expectations()
    first, last = day_window_utc(start, end, timezone)
    return [
        *(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in (*keys, "event_timestamp")),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=[*keys, "event_timestamp"]),
        gxe.ExpectColumnMinToBeBetween(column="event_timestamp", min_value=first, max_value=last),
        # freshness: the newest row belongs to the last requested day
        gxe.ExpectColumnMaxToBeBetween(
            column="event_timestamp", min_value=last - pd.Timedelta(hours=fresh_hours), max_value=last
        ),
        gxe.ExpectTableRowCountToBeBetween(min_value=rows[0], max_value=rows[1]),
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
    tables: Sequence[tuple[str, str, list[Expectation]]],
) -> list[SuiteReport]:
    reports = []
    for suite_name, table_url, expected in tables:
        frame = storage.read_partitions(table_url, layout.days(start, end), suite_name.split(".", 1)[-1])
        frame["date"] = frame["date"].astype(str)
        reports.append(run_suite(suite_name, frame, expected, gx_root(config.data_root)))
    return reports


def validate_raw(
    config: PipelineConfig, start: dt.date | None = None, end: dt.date | None = None
) -> list[SuiteReport]:
    """The Airflow-callable step: the source's dated raw tables of ``start..end``."""
    start, end = start or config.start_date, end or config.end_date
    suites = sources.of(config).raw_suites(config, start, end)
    return _validate_tables(
        config,
        start,
        end,
        [(f"raw.{t}", ingest.raw_url(config.data_root, t), expected) for t, expected in suites.items()],
    )


def prepared_url(data_root: str, table: str) -> str:
    return storage.join(data_root, "prepared", table)


def validate_features(
    config: PipelineConfig, start: dt.date | None = None, end: dt.date | None = None
) -> list[SuiteReport]:
    """The Airflow-callable step: the labels and every feature table of ``start..end``."""
    start, end = start or config.start_date, end or config.end_date
    suites = sources.of(config).feature_suites(config, start, end)
    return _validate_tables(
        config,
        start,
        end,
        [(f"features.{t}", prepared_url(config.data_root, t), expected) for t, expected in suites.items()],
    )


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
        sources.get(manifest["source"]).training_set_suite(
            manifest["feature_columns"], manifest["label_column"]
        ),
        gx_root(manifest["data_root"]),
    )
