"""Late and corrected raw data: the prepared days a re-landed raw day reaches, and re-preparing only those.

A raw day that lands again (late, or with corrections) changes its own flights' labels and schedule
features, and every trailing-window statistic that counts its flights. Those windows reach
forward: a flight of day D arrives by D + 2 at the latest (it departs at most a day late and flies
under a day) and counts for a window's length after its arrival, so the statistics of
D .. D + look-back change, the same `lookback_days` the preparation reads backwards. Nothing before
D changes. `reprepare` runs the preparation (the definition's engine) on exactly that reach,
clipped to the days already prepared; the training sets built afterwards differ where it reaches.

In the DAG a correction is an event on the raw flights asset with the day's partition key and an
extra that says so: key ``2013-01-09``, ``{"correction": true}`` (the producer re-landed that raw
partition first). The run's `reprepare_corrections` task re-prepares the reach of every corrected
day outside the days the run prepares anyway, and the run's ingest keeps the corrected partitions
as they landed.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipelines import prepare, sources, storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, MissingDataError

log = logging.getLogger(__name__)

Span = tuple[dt.date, dt.date]


def reach(day: dt.date, lookback_days: int, prepared: list[dt.date]) -> Span | None:
    """The prepared days a correction of raw ``day`` changes, or None when none is prepared there."""
    end = day + dt.timedelta(days=lookback_days)
    touched = [d for d in prepared if day <= d <= end]
    return (touched[0], touched[-1]) if touched else None


def spans(
    days: Iterable[dt.date], lookback_days: int, prepared: Sequence[dt.date], skip: Span | None = None
) -> list[Span]:
    """The runs of consecutive prepared days that corrections of raw ``days`` reach, oldest first,
    leaving out ``skip`` (the days a run prepares anyway)."""
    wanted = sorted(
        {
            d
            for day in days
            for d in prepared
            if day <= d <= day + dt.timedelta(days=lookback_days) and not (skip and skip[0] <= d <= skip[1])
        }
    )
    runs: list[Span] = []
    for d in wanted:
        if runs and d - runs[-1][1] == dt.timedelta(days=1):
            runs[-1] = (runs[-1][0], d)
        else:
            runs.append((d, d))
    return runs


def corrected_days(events: Iterable[tuple[str | None, Mapping[str, Any] | None]]) -> list[dt.date]:
    """The raw days that raw asset events, as (partition key, extra), say were re-landed with
    corrections: the key of each event whose extra has ``correction: true``, sorted and unique."""
    days = set()
    for key, extra in events:
        if not (extra or {}).get("correction"):
            continue
        try:
            days.add(dt.date.fromisoformat(str(key)))
        except ValueError:
            raise ConfigError(
                f"raw asset correction event: its partition key must be a day, YYYY-MM-DD, got {key!r}"
            ) from None
    return sorted(days)


def _prepared(config: PipelineConfig) -> list[dt.date]:
    return storage.list_partitions(storage.join(config.data_root, "prepared", "labels"))


def reprepare_days(config: PipelineConfig, days: Sequence[dt.date], skip: Span | None = None) -> list[Span]:
    """Re-prepare what re-landed raw ``days`` reach, outside ``skip``; returns the spans re-run
    (none when nothing is prepared there yet: the first preparation reads the corrected days)."""
    if not days:
        return []
    source = sources.of(config)
    raw = storage.join(config.data_root, "raw", source.announced)
    storage.require_partitions(raw, list(days), f"raw.{source.announced}")
    runs = spans(days, source.lookback_days(config.features), _prepared(config), skip)
    if not runs:
        log.info("corrections of %s: no prepared day in their reach outside %s", days, skip)
    for first, last in runs:
        log.info(
            "corrections of %s: re-preparing %s..%s (the trailing windows reach forward)", days, first, last
        )
        prepare.prepare(config, first, last)
    return runs


def reprepare(config: PipelineConfig, day: dt.date) -> Span | None:
    """Re-prepare the days a re-landed raw ``day`` reaches; returns them (None: nothing prepared there)."""
    if not _prepared(config):
        labels = storage.join(config.data_root, "prepared", "labels")
        raise MissingDataError(f"nothing is prepared at {labels} yet: run the preparation first")
    runs = reprepare_days(config, [day])
    return (runs[0][0], runs[-1][1]) if runs else None
