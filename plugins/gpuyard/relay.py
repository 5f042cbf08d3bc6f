"""The outbox relay: publishes unpublished events in batches, then marks them published.

Publishing happens while the batch is locked and before the mark commits, so a relay killed in
between leaves the rows unpublished and they are published again: at-least-once, never lost.
Replicas run side by side: `FOR UPDATE SKIP LOCKED` gives each a different batch.

The loop outlives every failure: an unreachable or refusing bus (READONLY, OOM), a database that is
down, times out or deadlocks, or a bug in one batch only delay publishing, with a capped backoff;
the outbox keeps the events meanwhile (docs/faults.md).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gpuyard import metrics
from gpuyard.bus.base import BusUnavailable, EventBus, Message
from gpuyard.clock import Clock, utcnow
from gpuyard.store.outbox import claim_unpublished, mark_published

log = logging.getLogger(__name__)


class Relay:
    def __init__(self, engine: Engine, bus: EventBus, *, batch_size: int = 200, clock: Clock = utcnow):
        self.engine, self.bus, self.batch_size, self.clock = engine, bus, batch_size, clock

    def run_once(self) -> int:
        """Publish one batch; returns how many events it published."""
        with self.engine.begin() as conn:
            batch = claim_unpublished(conn, self.batch_size)
            if not batch:
                metrics.relay_lag.set(0)
                return 0
            self.bus.publish([Message.from_event(event) for event in batch])
            now = self.clock()
            mark_published(conn, [event.seq for event in batch], now)
        metrics.events_published.inc(len(batch))
        metrics.relay_batches.inc()
        metrics.relay_lag.set(max(0.0, (now - batch[0].at).total_seconds()))
        log.debug("relay: published %d events (seq %d..%d)", len(batch), batch[0].seq, batch[-1].seq)
        return len(batch)

    def run(self, stop: threading.Event, *, poll_s: float = 0.05, max_backoff_s: float = 5.0) -> None:
        """Until `stop` is set: drain, then poll. Outages of the bus or the database only delay."""
        log.info("relay started: batches of %d, polling every %gs", self.batch_size, poll_s)
        backoff, failures = poll_s, 0
        while not stop.is_set():
            metrics.relay_loop.set_to_current_time()
            try:
                published = self.run_once()
            except Exception as error:
                metrics.relay_failures.inc()
                if isinstance(error, BusUnavailable | SQLAlchemyError):  # expected in an outage
                    log.warning("relay: %s; retrying in %.1fs", str(error).splitlines()[0], backoff)
                else:
                    log.exception("relay: publishing failed; retrying in %.1fs", backoff)
                stop.wait(backoff)
                backoff, failures = min(backoff * 2, max_backoff_s), failures + 1
                continue
            if failures:
                log.info("relay: publishing again after %d failed tries", failures)
            backoff, failures = poll_s, 0
            if published < self.batch_size:
                stop.wait(poll_s)
