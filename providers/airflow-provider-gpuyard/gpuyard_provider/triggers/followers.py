"""Followers: many jobs followed through ONE long poll on `/v1/events`, in one event loop.

A triggerer process may follow a thousand training jobs. Each trigger asks a `Followers` hub (one
per endpoint and event loop) to `follow(job_id, cursor)`; the hub keeps a single long poll open on
the event log and hands each job's events to its follower, so the API sees one waiting request
however many jobs are followed, and a state change reaches its follower within one poll.

A follower never misses or repeats an event: it registers with the hub before it reads its own
job's backlog above `cursor`, and reads that backlog up to at least the hub's position at
registration, so whatever the hub dispatched before the follower existed is in the backlog and
whatever came after is in its queue; seqs at or below what it has seen are dropped.

An outage of the API (a restart, a rolling update) is ridden out by the client under every read
(backoff with jitter, Retry-After honoured; the poll resumes from its cursor, so nothing is missed).
Past the client's deadline ($GPUYARD_CLIENT_OUTAGE_S, 300 s), or on a refusal, every follower
fails with the reason: the task fails, naming the API and how long it was away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, ClassVar

from gpuyard_client import AsyncGpuyardClient, Endpoint

log = logging.getLogger(__name__)

WAIT_S = 20.0  # the long poll's hold; the API answers as soon as an event arrives
PAGE = 1000
READS_IN_FLIGHT = 8  # followers' own reads at once: a burst queues here, not in the HTTP pool
SAVES_PER_S = 1.0  # cursor writes through Airflow's supervisor, each a database round trip
# After each page the poll waits this long before asking again: what changed meanwhile comes as one
# page, so followers tell in bursts (a job's quick run of changes in one record), and Airflow's
# triggerer supervisor, which reads its database each time the trigger runner writes to it, wakes
# a few times a second however many jobs change. The price: up to this much more latency.
# Airflow setting `[gpuyard] follow_pace_s` (AIRFLOW__GPUYARD__FOLLOW_PACE_S).
PACE_S = 0.5


def follow_pace_s() -> float:
    """The pace from Airflow's configuration; a bad value is refused, naming the setting."""
    from airflow.sdk.configuration import conf

    pace = conf.getfloat("gpuyard", "follow_pace_s", fallback=PACE_S)
    if not 0 <= pace <= 60:
        raise ValueError(f"[gpuyard] follow_pace_s: expected seconds from 0 to 60, got {pace}")
    return pace


class Followers:
    """The shared long poll of one endpoint in one event loop, and the jobs followed through it."""

    _hubs: ClassVar[dict[tuple[int, str, str], Followers]] = {}

    def __init__(self, endpoint: Endpoint, key: tuple[int, str, str]) -> None:
        self.key = key
        self.client = AsyncGpuyardClient(endpoint)
        self.cursor: int | None = None  # how far the shared poll has dispatched
        self._queues: dict[str, set[asyncio.Queue[list[dict[str, Any]] | BaseException]]] = {}
        self._pump: asyncio.Task[None] | None = None
        self._reads = asyncio.Semaphore(READS_IN_FLIGHT)
        # follower key -> (newest cursor, how to write it); one writer drains them in turn
        self._unsaved: dict[str, tuple[int, Callable[[int], Awaitable[None]]]] = {}
        self._wake_saver = asyncio.Event()
        self._saver: asyncio.Task[None] | None = None
        self.pace_s = follow_pace_s()

    @classmethod
    def of(cls, endpoint: Endpoint) -> Followers:
        key = (id(asyncio.get_running_loop()), endpoint.url, endpoint.token)
        if key not in cls._hubs:
            cls._hubs[key] = cls(endpoint, key)
        return cls._hubs[key]

    async def job(self, job_id: str) -> dict[str, Any]:
        """The job with its attempts (what a follower tells placements and steps from)."""
        async with self._reads:
            return await self.client.job(job_id)

    def save(self, key: Mapping[str, Any], cursor: int, write: Callable[[int], Awaitable[None]]) -> None:
        """Have `write(cursor)` run soon, in turn with every follower's; a newer cursor of the same
        follower replaces one still waiting."""
        name = repr(sorted(key.items()))
        self._unsaved.pop(name, None)
        self._unsaved[name] = (cursor, write)  # to the back of the line
        self._wake_saver.set()
        if self._saver is None or self._saver.done():
            self._saver = asyncio.create_task(self._save_in_turn(), name="gpuyard-cursors")

    def forget(self, key: Mapping[str, Any]) -> None:
        """Drop a follower's waiting cursor (it ended: nothing of it needs resuming)."""
        self._unsaved.pop(repr(sorted(key.items())), None)

    async def _save_in_turn(self) -> None:
        while True:
            if not self._unsaved:
                self._wake_saver.clear()
                await self._wake_saver.wait()
                continue
            name = next(iter(self._unsaved))
            cursor, write = self._unsaved.pop(name)
            try:
                await write(cursor)
            except Exception:  # a lost save costs a repeat after a restart, never the following
                log.warning("gpuyard: saving a follower's cursor failed", exc_info=True)
            await asyncio.sleep(1 / SAVES_PER_S)

    async def follow(self, job_id: str, cursor: int) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of `job_id`'s events above `cursor`, oldest first, each event exactly once; an
        empty batch marks the end of the backlog (the follower may then read the job's state)."""
        queue: asyncio.Queue[list[dict[str, Any]] | BaseException] = asyncio.Queue()
        self._queues.setdefault(job_id, set()).add(queue)
        if self._pump is None or self._pump.done():
            self.cursor = cursor  # the poll starts where its first follower stands
            self._pump = asyncio.create_task(self._run(), name="gpuyard-followers")
        joined_at = self.cursor if self.cursor is not None else cursor
        try:
            seen = cursor
            while True:  # the backlog, up to at least where the poll stood when we joined
                async with self._reads:
                    page = await self.client.events(job_id=job_id, after=seen, limit=PAGE)
                fresh = [e for e in page["events"] if e["seq"] > seen]
                seen = max(seen, page["cursor"])
                if fresh:
                    yield fresh
                if seen >= joined_at and len(page["events"]) < PAGE:
                    break
            yield []
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                fresh = [e for e in item if e["seq"] > seen]
                if fresh:
                    seen = fresh[-1]["seq"]
                    yield fresh
        finally:
            self._queues[job_id].discard(queue)
            if not self._queues[job_id]:
                del self._queues[job_id]
            if not self._queues:
                await self._close()

    async def _close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        if self._saver is not None:
            self._saver.cancel()
        if self._hubs.get(self.key) is self:
            del self._hubs[self.key]
        await self.client.aclose()

    async def _run(self) -> None:
        while self._queues:
            try:  # the client rides out an outage; what comes out is final
                page = await self.client.events(after=self.cursor, wait_s=WAIT_S, limit=PAGE)
            except Exception as error:
                # Refused (a revoked token, a bad cursor), away past the deadline (ApiUnreachable), or
                # a fault of ours: every follower fails with the reason, none waits forever.
                log.warning("gpuyard events: %s; its followers fail", error)
                for queues in self._queues.values():
                    for queue in queues:
                        queue.put_nowait(error)
                return
            by_job: dict[str, list[dict[str, Any]]] = {}
            for event in page["events"]:
                by_job.setdefault(event["job_id"], []).append(event)
            for job_id, batch in by_job.items():
                for queue in self._queues.get(job_id, ()):
                    queue.put_nowait(batch)
            self.cursor = page["cursor"]
            if len(page["events"]) < PAGE:
                await asyncio.sleep(self.pace_s)
