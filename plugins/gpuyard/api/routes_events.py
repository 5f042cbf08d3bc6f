"""/v1/events: the event log by cursor, with long polls, for followers such as Airflow's triggerer.

`GET /v1/events?after=N[&job=ID][&wait=S][&limit=L]` answers the caller's events above cursor N
(every team's for platform admins), oldest first, and `cursor`: a reader that always passes the
cursor it was given as the next `after` sees every event once, in order, across restarts (the
cursor is a position in the store, not in this process). Without `after` it starts from now. With
`wait`, an empty page is held up to S seconds until an event arrives.

One EventFeed per server process watches the log's trusted head (store/events.py) while requests
wait: one small query every `poll_s` however many wait, and it wakes only the requests whose
events arrived.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from gpuyard.api.auth import ApiContext, context, principal
from gpuyard.api.problems import PROBLEM_RESPONSES, not_found
from gpuyard.store import events as event_store
from gpuyard.store import jobs as job_store
from gpuyard.store.teams import Principal

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["events"], responses=PROBLEM_RESPONSES)

POLL_S = 0.1
HOLE_GRACE_S = 5.0  # an outbox transaction that holds its seq longer than this is not waited for
SETTLED_S = 60.0  # rows older than this were committed long ago: where a fresh feed starts walking
MARK_BATCH = 10_000


class FeedEventOut(BaseModel):
    seq: int
    type: str
    job_id: str
    attempt_id: str | None
    data: dict[str, Any]
    at: datetime | None


class EventPage(BaseModel):
    events: list[FeedEventOut]
    cursor: int


@dataclass(eq=False)
class _Waiter:
    job_id: str | None
    teams: frozenset[str] | None
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def wants(self, mark: event_store.Mark) -> bool:
        return (self.job_id is None or mark.job_id == self.job_id) and (
            self.teams is None or mark.team in self.teams
        )


class EventFeed:
    """The trusted head of the event log in this process, and the long polls waiting above it."""

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], datetime],
        *,
        poll_s: float = POLL_S,
        grace_s: float = HOLE_GRACE_S,
    ) -> None:
        self.engine, self.clock, self.poll_s, self.grace_s = engine, clock, poll_s, grace_s
        self._head: event_store.Head | None = None
        self._scanned_at = float("-inf")
        self._lock = asyncio.Lock()
        self._waiters: set[_Waiter] = set()
        self._poller: asyncio.Task[None] | None = None

    @property
    def seq(self) -> int:
        return self._head.seq if self._head is not None else 0

    async def head(self) -> int:
        """The trusted head as read by a scan that started after this call (a reader sees its own
        writes); calls that arrive during a scan share the next one."""
        asked_at = time.monotonic()
        if self._scanned_at >= asked_at:
            return self.seq
        async with self._lock:
            if self._scanned_at < asked_at:
                started = time.monotonic()
                marks = await run_in_threadpool(self._scan)
                self._scanned_at = started
                for waiter in list(self._waiters):
                    if any(waiter.wants(mark) for mark in marks):
                        waiter.woken.set()
        return self.seq

    async def wait(
        self, job_id: str | None, teams: frozenset[str] | None, seen: int, timeout_s: float
    ) -> None:
        """Return once events for this reader arrive above `seen` (the head it read to), or on timeout."""
        waiter = _Waiter(job_id, teams)
        self._waiters.add(waiter)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            if self.seq > seen:  # the head moved between the reader's read and now
                return
            await asyncio.wait_for(waiter.woken.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)

    async def _poll(self) -> None:
        while self._waiters:
            try:
                await self.head()
            except Exception:  # the store is down: waiters time out and their clients retry
                log.warning("event feed: reading the log's head failed", exc_info=True)
            await asyncio.sleep(self.poll_s)

    def _scan(self) -> list[event_store.Mark]:
        """Advance the head over what committed since the last scan; returns the rows passed."""
        arrived: list[event_store.Mark] = []
        with self.engine.connect() as conn:
            if self._head is None:
                since = self.clock() - timedelta(seconds=SETTLED_S)
                self._head = event_store.Head(event_store.start_head(conn, since))
            while True:
                before = self._head.seq
                batch = event_store.marks_after(conn, before, MARK_BATCH)
                self._head.advance([m.seq for m in batch], time.monotonic(), self.grace_s)
                arrived += [m for m in batch if m.seq <= self._head.seq]
                if len(batch) < MARK_BATCH or self._head.seq == before:
                    return arrived


def _feed(request: Request, ctx: ApiContext) -> EventFeed:
    # One feed per event loop: its locks and events belong to the loop that serves the requests.
    loop = asyncio.get_running_loop()
    held = getattr(request.app.state, "event_feed", None)
    if held is None or held[0] is not loop:
        held = (loop, EventFeed(ctx.engine, ctx.clock))
        request.app.state.event_feed = held
    return held[1]  # type: ignore[no-any-return]


def _read(
    ctx: ApiContext, after: int, upto: int, job: str | None, teams: frozenset[str] | None, limit: int
) -> list[FeedEventOut]:
    with ctx.engine.connect() as conn:
        found = event_store.read(
            conn, after=after, upto=upto, job_id=job, teams=sorted(teams) if teams else None, limit=limit
        )
    return [
        FeedEventOut(seq=e.seq, type=e.type, job_id=e.job_id, attempt_id=e.attempt_id, data=e.data, at=e.at)
        for e in found
    ]


def _check_job(ctx: ApiContext, caller: Principal, job_id: str) -> None:
    with ctx.engine.connect() as conn:
        job = job_store.get(conn, job_id)
    if job is None or not caller.can_see(job.team):
        raise not_found(f"job {job_id}")


@router.get("/events", response_model=EventPage)
async def list_events(
    request: Request,
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    after: int | None = Query(None, ge=0, description="Cursor from the last page; absent: from now."),
    job: str | None = Query(None, max_length=40, description="Only this job's events."),
    wait: float = Query(0.0, ge=0, le=60, description="Seconds to hold an empty page for new events."),
    limit: int = Query(500, ge=1, le=1000),
) -> EventPage:
    """The caller's events above `after`, oldest first; `cursor` is the next `after`."""
    if job is not None:
        await run_in_threadpool(_check_job, ctx, caller, job)
    teams = None if caller.is_platform_admin else frozenset({caller.team})
    feed = _feed(request, ctx)
    head = await feed.head()
    start = head if after is None else after
    found = await run_in_threadpool(_read, ctx, start, head, job, teams, limit) if head > start else []
    if not found and wait > 0:
        await feed.wait(job, teams, head, wait)
        head = feed.seq
        found = await run_in_threadpool(_read, ctx, start, head, job, teams, limit) if head > start else []
    cursor = found[-1].seq if len(found) == limit else max(start, head)
    return EventPage(events=found, cursor=cursor)
