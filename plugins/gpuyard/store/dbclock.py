"""The database's clock: the one every lease expiry, reap and leadership comparison is made with.

Processes of the control plane run on different machines whose clocks may be skewed (an API replica
60 s ahead would otherwise write leases that a scheduler 60 s behind reaps early). So each process
reads PostgreSQL's `clock_timestamp()` now and then and counts forward with its own monotonic clock,
which no wall-clock skew or step moves. The error is at most half a round trip, plus the drift of the
monotonic clock between syncs (parts per million); so a sync whose round trip was slow (a stalled
link, a database that answered late) is not taken while an earlier one counts on: the fault suite's
seed 1122 saw an API's clock 4.9 s ahead for a resync period after one that took 10 s, and lost
progress charged from it. On SQLite the database is a file of this machine, whose clock is the
database's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Engine, func, select

from gpuyard.clock import Clock, utcnow

log = logging.getLogger(__name__)


class SlowSync(RuntimeError):
    """A sync's round trip was too slow to trust its reading."""


class DatabaseClock:
    """A Clock that tells the database's time; resyncs every `resync_s`, taking a reading only when
    its round trip took at most `max_round_trip_s` (but the first: there is nothing better)."""

    def __init__(
        self,
        engine: Engine,
        *,
        resync_s: float = 30.0,
        max_round_trip_s: float = 0.5,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.engine, self.resync_s, self.monotonic = engine, resync_s, monotonic
        self.max_round_trip_s = max_round_trip_s
        self._lock = threading.Lock()
        self._anchor: tuple[float, datetime] | None = None  # (monotonic, database time) at the last sync

    def sync(self) -> None:
        with self.engine.connect() as conn:
            sent = self.monotonic()
            database_now = conn.execute(select(func.clock_timestamp())).scalar_one()
            received = self.monotonic()
        if self._anchor is not None and received - sent > self.max_round_trip_s:
            raise SlowSync(f"a round trip of {received - sent:.1f}s")
        self._anchor = ((sent + received) / 2, database_now)

    def __call__(self) -> datetime:
        with self._lock:
            if self._anchor is None or self.monotonic() - self._anchor[0] > self.resync_s:
                try:
                    self.sync()
                except Exception as error:  # the database is away: keep counting from the last sync
                    if self._anchor is None:
                        raise
                    log.warning("database clock: resync failed (%s); counting from the last sync", error)
            assert self._anchor is not None
            at, database_time = self._anchor
        return database_time + timedelta(seconds=self.monotonic() - at)


def database_clock(engine: Engine) -> Clock:
    return DatabaseClock(engine) if engine.dialect.name == "postgresql" else utcnow
