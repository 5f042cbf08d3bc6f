"""/v1/queue: the waiting jobs in queue order, each with why it waits as the scheduler says it, and
the teams' quota, borrowing and use. Filtered and paged on the server (fast with 10,000 waiting).

The reasons are the scheduler's: its pass records why each job waits as it decides (store/waits.py),
and this reads the record with the queue's rows (domain/waiting.py `row_reason`); the API never runs
a cycle. The queue and its reasons are read together once for every caller and refreshed in the
background at most every QUEUE_TTL_S (api/context.py `Refreshed`): a request filters and pages in
memory, and sees the queue as it was at most that long ago. Members see their team's jobs and team
only; admins every team.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from gpuyard.api.auth import ApiContext, context, principal
from gpuyard.api.problems import PROBLEM_RESPONSES
from gpuyard.domain.spec import PRIORITY_CLASSES
from gpuyard.domain.waiting import CODES, RecordedReason, row_reason
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store import waits as wait_store
from gpuyard.store.teams import Principal

router = APIRouter(prefix="/v1", tags=["queue"], responses=PROBLEM_RESPONSES)

PRIORITY_NAMES = {value: name for name, value in PRIORITY_CLASSES.items()}


class QueuedOut(BaseModel):
    id: str
    team: str
    name: str
    priority: str
    gpus: int
    attempts: int = Field(description="Attempts so far: more than 0 means a retry waits")
    waiting_since: datetime = Field(description="When it last entered the queue")
    age_s: float = Field(description="Seconds since it was submitted")
    reason: str = Field(description=f"Why it waits, one of: {', '.join(CODES)}")
    reason_text: str
    reason_since: datetime | None = Field(description="Since when the scheduler has given this reason")


class TeamQueueOut(BaseModel):
    name: str
    gpu_quota: int
    cohort: str | None
    weight: float
    used_gpus: int
    borrowed_gpus: int
    waiting_jobs: int
    waiting_gpus: int


class QueuePage(BaseModel):
    total: int = Field(description="Jobs matching the filters (the page is a slice of them)")
    offset: int
    items: list[QueuedOut]
    reasons: dict[str, int] = Field(description="Waiting jobs per reason, before the reason filter")
    teams: list[TeamQueueOut]
    policy: str
    as_of: datetime = Field(description="When the queue and its reasons were read (at most QUEUE_TTL_S ago)")


@dataclass(frozen=True)
class Queue:
    """The whole queue as of `at`: its rows in order, the scheduler's reasons, the teams' use."""

    at: datetime
    rows: list[job_store.QueuedRow]
    reasons: dict[str, RecordedReason]
    usage: dict[str, int]  # GPUs leased per team
    borrowed: dict[str, int]  # of which borrowed from the cohort


def read(ctx: ApiContext) -> Queue:
    now = ctx.clock()
    with ctx.engine.connect() as conn:
        usage, borrowed = attempt_store.leased_by_team(conn)
        return Queue(now, job_store.queued(conn, None), wait_store.read(conn), usage, borrowed)


@router.get("/queue", response_model=QueuePage)
def queue(
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    team: str | None = Query(None, max_length=63),
    reason: str | None = Query(None, pattern=f"^({'|'.join(CODES)})$", description="One of the reason codes"),
    job: str | None = Query(None, max_length=64, description="This job only (why it waits, if it does)"),
    offset: int = Query(0, ge=0, le=10_000_000),
    limit: int = Query(50, ge=1, le=500),
) -> QueuePage:
    """Priority first, then oldest: the order the scheduler looks at the queue (before fair share)."""
    teams = [team] if team is not None else (None if caller.is_platform_admin else [caller.team])
    if teams is not None and not all(caller.can_see(t) for t in teams):
        teams = []
    queue: Queue = ctx.queue_view.get(lambda: read(ctx))
    now = ctx.clock()
    with ctx.engine.connect() as conn:  # a small table, read fresh: a team made since is shown
        quotas = team_store.list_teams(conn)
    visible = None if teams is None else set(teams)
    rows = [r for r in queue.rows if (visible is None or r.team in visible) and job in (None, r.id)]
    read_reasons = [
        row_reason(
            queue.reasons.get(r.id),
            updated_at=r.updated_at,
            not_before=r.not_before,
            cancel=r.cancel_requested,
            now=now,
        )
        for r in rows
    ]
    reasons = [why for why, _ in read_reasons]
    since = {r.id: at for r, (_, at) in zip(rows, read_reasons, strict=True)}
    counts: dict[str, int] = {}
    waiting: dict[str, list[int]] = {}
    for row, why in zip(rows, reasons, strict=True):
        counts[why.code] = counts.get(why.code, 0) + 1
        jobs_gpus = waiting.setdefault(row.team, [0, 0])
        jobs_gpus[0] += 1
        jobs_gpus[1] += row.gpus
    matching = [(r, w) for r, w in zip(rows, reasons, strict=True) if reason is None or w.code == reason]
    shown = sorted(quotas) if teams is None else [t for t in teams if t in quotas]
    return QueuePage(
        total=len(matching),
        offset=offset,
        items=[
            QueuedOut(
                id=r.id,
                team=r.team,
                name=r.name,
                priority=PRIORITY_NAMES.get(r.priority, str(r.priority)),
                gpus=r.gpus,
                attempts=r.attempt_count,
                waiting_since=r.updated_at,
                age_s=max(0.0, (now - r.created_at).total_seconds()),
                reason=w.code,
                reason_text=w.text,
                reason_since=since[r.id],
            )
            for r, w in matching[offset : offset + limit]
        ],
        reasons=counts,
        teams=[
            TeamQueueOut(
                name=name,
                gpu_quota=quotas[name].gpu_quota,
                cohort=quotas[name].cohort,
                weight=quotas[name].weight,
                used_gpus=queue.usage.get(name, 0),
                borrowed_gpus=queue.borrowed.get(name, 0),
                waiting_jobs=waiting.get(name, [0, 0])[0],
                waiting_gpus=waiting.get(name, [0, 0])[1],
            )
            for name in shown
        ],
        policy=ctx.settings.scheduler_policy,
        as_of=queue.at,
    )
