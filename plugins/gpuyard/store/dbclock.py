"""The database's clock: the one every lease expiry, reap and leadership comparison is made with.

Processes of the control plane run on different machines whose clocks may be skewed (an API replica
60 s ahead would otherwise write leases that a scheduler 60 s behind reaps early). So each process
reads PostgreSQL's `clock_timestamp()` now and then and counts forward with its own monotonic clock,
which no wall-clock skew or step moves. The error is at most half a round trip, plus the drift of the
monotonic clock between syncs (parts per million). On SQLite the database is a file of this machine,
whose clock is the database's.
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


class DatabaseClock:
    """A Clock that tells the database's time; resyncs every `resync_s`."""

    def __init__(
        self, engine: Engine, *, resync_s: float = 30.0, monotonic: Callable[[], float] = time.monotonic
    ):
        self.engine, self.resync_s, self.monotonic = engine, resync_s, monotonic
        self._lock = threading.Lock()
        self._anchor: tuple[float, datetime] | None = None  # (monotonic, database time) at the last sync

    def sync(self) -> None:
        with self.engine.connect() as conn:
            sent = self.monotonic()
            database_now = conn.execute(select(func.clock_timestamp())).scalar_one()
            received = self.monotonic()
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
