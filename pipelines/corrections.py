"""Late and corrected raw data: the prepared days a re-landed raw day reaches, and re-preparing only those.

A raw day that lands again (late, or with corrections) changes its own flights' labels and schedule
features, and every trailing-window statistic that counts its flights. Those windows reach
forward: a flight of day D arrives by D + 2 at the latest (it departs at most a day late and flies
under a day) and counts for a window's length after its arrival, so the statistics of
D .. D + look-back change, the same `lookback_days` the preparation reads backwards. Nothing before
D changes. `reprepare` runs the preparation (the definition's engine) on exactly that reach,
clipped to the days already prepared; the training sets built afterwards differ where it reaches.
"""

from __future__ import annotations

import datetime as dt
import logging

from pipelines import prepare, storage
from pipelines.config import PipelineConfig
from pipelines.errors import MissingDataError

log = logging.getLogger(__name__)


def reach(day: dt.date, lookback_days: int, prepared: list[dt.date]) -> tuple[dt.date, dt.date] | None:
    """The prepared days a correction of raw ``day`` changes, or None when none is prepared there."""
    end = day + dt.timedelta(days=lookback_days)
    touched = [d for d in prepared if day <= d <= end]
    return (touched[0], touched[-1]) if touched else None


def reprepare(config: PipelineConfig, day: dt.date) -> tuple[dt.date, dt.date] | None:
    """Re-prepare the days a re-landed raw ``day`` reaches; returns them (None: nothing prepared there)."""
    storage.require_partitions(storage.join(config.data_root, "raw", "flights"), [day], "raw.flights")
    labels = storage.join(config.data_root, "prepared", "labels")
    prepared = storage.list_partitions(labels)
    if not prepared:
        raise MissingDataError(f"nothing is prepared at {labels} yet: run the preparation first")
    days = reach(day, prepare.flight_params(config).lookback_days, prepared)
    if days is None:
        log.info("correction of %s: no prepared day in its reach, nothing to re-run", day)
        return None
    log.info("correction of %s: re-preparing %s..%s (the trailing windows reach forward)", day, *days)
    prepare.prepare(config, *days)
    return days
