"""The outbox relay: publishes unpublished events in batches, then marks them published.

Publishing happens while the batch is locked and before the mark commits, so a relay killed in
between leaves the rows unpublished and they are published again: at-least-once, never lost.
Replicas run side by side: `FOR UPDATE SKIP LOCKED` gives each a different batch.

The loop outlives every failure: an unreachable or refusing bus (READONLY, OOM), a database that is
down, times out or deadlocks, or a bug in one batch only delay publishing, with a capped backoff;
the outbox keeps the events meanwhile (docs/faults.md).

An idle relay polls less and less often, up to `idle_poll_s`: a relay polling its database twenty
times a second costs an idle control plane more than anything else it does. A commit that appended
events in the relay's own process (`gpuyard up`) wakes it at once (`outbox.on_events_committed`);
a relay of its own (production) finds them within `idle_poll_s`, and the scheduler, whom the events
only wake, passes every second anyway.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gpuyard import metrics
from gpuyard.bus.base import BusUnavailable, EventBus, Message
from gpuyard.clock import Clock, utcnow
from gpuyard.store.outbox import claim_unpublished, mark_published

log = logging.getLogger(__name__)
STOP_CHECK_S = 0.25  # how soon a relay waiting for a wake-up notices `stop`


class Relay:
    def __init__(
        self,
        engine: Engine,
        bus: EventBus,
        *,
        batch_size: int = 200,
        clock: Clock = utcnow,
        wake: threading.Event | None = None,
    ):
        """`wake`: set when this process committed events (the relay then polls at once)."""
        self.engine, self.bus, self.batch_size, self.clock = engine, bus, batch_size, clock
        self.wake = wake

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

    def run(
        self,
        stop: threading.Event,
        *,
        poll_s: float = 0.05,
        idle_poll_s: float = 1.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        """Until `stop` is set: drain, then poll, every `poll_s` after a batch and twice as long after
        each empty poll, up to `idle_poll_s`. Outages of the bus or the database only delay."""
        log.info(
            "relay started: batches of %d, polling every %gs (%gs when idle)",
            self.batch_size,
            poll_s,
            idle_poll_s,
        )
        backoff, failures, idle = poll_s, 0, poll_s
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
            if published == self.batch_size:
                continue  # a full batch: more may wait
            idle = next_wait(idle, published, poll_s=poll_s, idle_poll_s=idle_poll_s)
            self._sleep(stop, idle)

    def _sleep(self, stop: threading.Event, seconds: float) -> None:
        """Wait `seconds`, or less: until `stop`, or until this process commits events (`wake`)."""
        if self.wake is None:
            stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.wake.wait(min(left, STOP_CHECK_S)):
                break
        self.wake.clear()


def next_wait(last_s: float, published: int, *, poll_s: float, idle_poll_s: float) -> float:
    """The wait before the next poll: `poll_s` after one that published, else twice the last wait, at
    most `idle_poll_s` (never less than `poll_s`)."""
    return poll_s if published else min(last_s * 2, max(idle_poll_s, poll_s))
