"""/v1/fleet (nodes, free and leased GPUs), /v1/jobs/{id}/logs (workers' output), /v1/metrics/summary
and /v1/metrics/series (the same figures over time, in total and per team).

Scoped to the caller: a member sees how many GPUs of each node are free, but which ones are leased
only for its own team's attempts, and a summary of its own team's jobs; platform admins see all.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from datetime import timedelta

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import StreamingResponse
from gpuyard_client import LOG_ATTEMPT_HEADER, parse_log_offset
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from gpuyard.api.auth import ApiContext, context, principal
from gpuyard.api.log_position import after_offset
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem, not_found
from gpuyard.platform_metrics import Summary, summarize
from gpuyard.platform_series import Point, series
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.teams import Principal

router = APIRouter(prefix="/v1", tags=["fleet"], responses=PROBLEM_RESPONSES)


class LeaseOut(BaseModel):
    gpu: int
    job_id: str
    job_name: str
    team: str
    attempt_id: str


class NodeOut(BaseModel):
    name: str
    site: str
    cluster: str
    domain: str
    gpu_type: str
    gpus: int
    leased_gpus: list[int] = Field(description="GPUs leased by the caller's team (every team's for admins).")
    leases: list[LeaseOut] = Field(description="Who holds each of `leased_gpus`: job, attempt, team.")
    free_gpus: int
    gpu_memory_gb: float
    price_per_gpu_hour: float
    preemptible: bool
    taints: list[str]


@router.get("/fleet", response_model=list[NodeOut])
def fleet(ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)) -> list[NodeOut]:
    """Every node with its GPUs: how many are free, and which are leased by the caller's team."""
    with ctx.engine.connect() as conn:
        leased = attempt_store.leased_gpus(conn)
        visible = _leases(conn, None if caller.is_platform_admin else caller.team)
    return [
        NodeOut(
            name=n.name,
            site=n.site,
            cluster=n.cluster,
            domain=n.domain,
            gpu_type=n.gpu_type,
            gpus=n.gpus,
            leased_gpus=sorted(visible.get(n.name, {})),
            leases=[LeaseOut(gpu=gpu, **held) for gpu, held in sorted(visible.get(n.name, {}).items())],
            free_gpus=n.gpus - len(leased.get(n.name, ())),
            gpu_memory_gb=n.gpu_memory_gb,
            price_per_gpu_hour=n.price_per_gpu_hour,
            preemptible=n.preemptible,
            taints=list(n.taints),
        )
        for n in ctx.fleet.nodes
    ]


def _leases(conn: Connection, team: str | None) -> dict[str, dict[int, dict[str, str]]]:
    """node -> GPU -> the live attempt holding it, of `team` (None: every team)."""
    held: dict[str, dict[int, dict[str, str]]] = {}
    for item in attempt_store.live(conn):
        if team is None or item.job.team == team:
            who = {
                "job_id": item.job.id,
                "job_name": item.job.name,
                "team": item.job.team,
                "attempt_id": item.attempt.id,
            }
            for piece in item.attempt.placement.get("nodes", []):
                for gpu in piece["gpus"]:
                    held.setdefault(piece["node"], {})[gpu] = who
    return held


@router.get(
    "/jobs/{job_id}/logs", response_class=StreamingResponse, responses={200: {"content": {"text/plain": {}}}}
)
def logs(
    job_id: str = Path(max_length=64),
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    attempt: int | None = Query(None, ge=1, le=100_000, description="Attempt number; default the newest."),
    follow: bool = Query(False, description="Keep streaming until the attempt ends."),
    offset: str = Query(
        "",
        max_length=4096,
        pattern=r"^(\d*:\d+(,\d*:\d+)*)?$",
        description="Lines already read, per rank: `RANK:LINES,...` (`:LINES` for unlabelled lines); "
        "a broken stream resumes after them.",
    ),
) -> StreamingResponse:
    """The workers' output of one attempt of the job, as plain text; the header Gpuyard-Attempt names
    the attempt (a resumed read asks for it by number)."""
    detail = job_store.detail(ctx.engine, job_id)
    if detail is None or not caller.can_see(detail.job.team):
        raise not_found(f"job {job_id}")
    if not detail.attempts:
        raise Problem(
            409,
            "No attempt yet",
            f"job {job_id} is {detail.job.state} and has not run yet",
            kind="/problems/no-attempt",
        )
    chosen = (
        detail.attempts[-1]
        if attempt is None
        else next((a for a in detail.attempts if a.number == attempt), None)
    )
    if chosen is None:
        raise not_found(f"attempt {attempt} of job {job_id}")
    if ctx.logs is None:
        raise Problem(
            501, "Not Implemented", "this deployment's launcher serves no logs", kind="/problems/no-logs"
        )
    lines: Iterator[str] = after_offset(ctx.logs(chosen.id, follow), parse_log_offset(offset))
    return StreamingResponse(
        lines, media_type="text/plain; charset=utf-8", headers={LOG_ATTEMPT_HEADER: str(chosen.number)}
    )


def platform_summary(ctx: ApiContext, hours: float, teams: Collection[str] | None = None) -> Summary:
    """The summary of the last `hours`; with `teams`, of those teams' jobs only."""
    now = ctx.clock()
    since = now - timedelta(hours=hours)
    with ctx.engine.connect() as conn:
        attempt_records, job_records = attempt_store.metric_records(conn, since)
        quotas = team_store.list_teams(conn)
    prices = {n.name: float(n.price_per_gpu_hour) for n in ctx.fleet.nodes}
    return summarize(attempt_records, job_records, quotas, prices, now, since, teams)


@router.get("/metrics/summary", response_model=Summary)
def metrics_summary(
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    hours: float = Query(24.0 * 7, gt=0, le=24.0 * 366, description="Window: the last this many hours."),
) -> Summary:
    """Goodput, queue wait, resumes, cost, lost progress and fair-share attainment, from recorded events:
    of the caller's team, or of the whole platform for platform admins."""
    return platform_summary(ctx, hours, None if caller.is_platform_admin else {caller.team})


class SeriesOut(BaseModel):
    hours: float
    steps: int
    total: list[Point] = Field(description="Every visible team together (the whole platform for admins)")
    teams: dict[str, list[Point]]


@router.get("/metrics/series", response_model=SeriesOut)
def metrics_series(
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    hours: float = Query(
        24.0, ge=1 / 60, le=24.0 * 366, description="Window: the last this many hours (a minute at least)."
    ),
    steps: int = Query(48, ge=1, le=1000, description="Equal steps the window is cut into."),
) -> SeriesOut:
    """The summary's figures per step of the window: utilization, goodput, wait p50/p99, resumes,
    lost progress, cost per job and idle cost; of the caller's team, or of every team for admins."""
    end = ctx.clock()
    start = end - timedelta(hours=hours)
    with ctx.engine.connect() as conn:
        attempt_records, job_records = attempt_store.metric_records(conn, start)
        names = sorted(team_store.list_teams(conn))
    prices = {n.name: float(n.price_per_gpu_hour) for n in ctx.fleet.nodes}
    fleet_gpus = sum(n.gpus for n in ctx.fleet.nodes)
    fleet_cost = sum(n.gpus * float(n.price_per_gpu_hour) for n in ctx.fleet.nodes)
    visible = names if caller.is_platform_admin else [caller.team]

    def of(teams: list[str] | None) -> list[Point]:
        return series(attempt_records, job_records, prices, fleet_gpus, fleet_cost, start, end, steps, teams)

    return SeriesOut(
        hours=hours,
        steps=steps,
        total=of(None if caller.is_platform_admin else visible),
        teams={team: of([team]) for team in visible},
    )
