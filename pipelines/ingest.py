"""Ingest step: lands a data source's raw tables under ``<data_root>/raw/`` as parquet, one partition per day.

The source's dated tables (pipelines/sources.py) are partitioned by their ``date`` column (their local
day); its reference tables are small snapshots replaced as a whole. Re-running a date replaces that
date's partitions, so the step is idempotent.
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
from pipelines.sources import Source

log = logging.getLogger(__name__)


def raw_url(data_root: str, table: str) -> str:
    return storage.join(data_root, "raw", table)


@dataclass(frozen=True)
class IngestResult:
    """What one ingest run landed: rows per table and the dates written."""

    rows: Mapping[str, int]
    dates: tuple[dt.date, ...]


def land_tables(
    source: Source,
    tables: Mapping[str, pd.DataFrame],
    data_root: str,
    start: dt.date,
    end: dt.date,
    keep: Collection[dt.date] = (),
) -> IngestResult:
    """Land the source's raw tables for the dates ``start..end`` (inclusive), except the announced
    table's partitions of ``keep`` (days a producer re-landed with corrections: the source's copy
    would undo them).

    A date without rows in the announced table is an error: the source does not cover the range.
    """
    missing = [t for t in (*source.dated, *source.reference) if t not in tables]
    if missing:
        raise MissingDataError(f"ingest: source tables {missing} are missing")
    rows: dict[str, int] = {}
    for name in source.reference:
        storage.write_table(tables[name], raw_url(data_root, name))
        rows[name] = len(tables[name])
        log.info("ingest: landed %s (%d rows)", name, len(tables[name]))
    wanted = pd.date_range(start, end, freq="D").date
    for name in source.dated:
        frame = tables[name]
        days = frame[storage.PARTITION_KEY]
        chosen = (days >= start) & (days <= end)
        in_range = frame[chosen]
        by_day = dict(tuple(in_range.groupby(days[chosen])))
        announced = name == source.announced
        if announced:
            absent = [d for d in wanted if d not in by_day]
            if absent:
                raise MissingDataError(
                    f"ingest: the source has no {name} for {len(absent)} requested date(s), first "
                    f"{absent[0].isoformat()}; source covers {days.min()}..{days.max()}"
                )
        for day in wanted:
            if announced and day in keep:
                log.info("ingest: raw %s of %s kept as re-landed (a correction)", name, day)
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
    """The Airflow-callable step: land the config's source for ``start..end`` (default: the config's
    dates), the announced table's partitions of ``keep`` left as they are."""
    source = sources.of(config)
    return land_tables(
        source, source.load(), config.data_root, start or config.start_date, end or config.end_date, keep
    )
