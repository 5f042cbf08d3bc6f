"""/v1/jobs: submit (idempotent, transactional outbox), list, show, cancel.

A submit is admitted before it is stored: the caller's team, its quota, its admission policy
(registries, digests, priority classes), its checkpoint roots, the secrets it names, and whether the
fleet could ever run it.
"""

from __future__ import annotations

import base64
import binascii

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from gpuyard import metrics
from gpuyard.api.auth import ApiContext, context, principal
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem, not_found
from gpuyard.api.schemas import JobDetailOut, JobOut, JobPage
from gpuyard.domain.admission import check_admission
from gpuyard.domain.checkpoint_roots import check_checkpoint_url, roots_for
from gpuyard.domain.feasibility import check_data_sites, check_feasible, check_quota
from gpuyard.domain.spec import JobSpec, SpecRejected, SpecViolation
from gpuyard.domain.states import JobState
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.teams import Principal, Team

router = APIRouter(prefix="/v1", tags=["jobs"], responses=PROBLEM_RESPONSES)

JobId = Path(max_length=64)


async def _team(ctx: ApiContext, name: str) -> Team | None:
    def load(key: str) -> Team | None:
        with ctx.engine.connect() as conn:
            return team_store.get_team(conn, key)

    return await ctx.teams.get_async(name, load)  # type: ignore[no-any-return]


def _idempotency_key(value: str | None) -> str | None:
    if value is not None and not 1 <= len(value) <= 255:
        raise SpecRejected.one("header.idempotency-key", "must be 1 to 255 characters long")
    return value


async def _admit(ctx: ApiContext, caller: Principal, spec: JobSpec) -> None:
    if not caller.can_see(spec.team):
        raise Problem(
            403, "Forbidden", f"a token of team {caller.team} cannot submit jobs for team {spec.team}"
        )
    team = await _team(ctx, spec.team)
    if team is None:
        raise SpecRejected.one("team", f"no team named {spec.team!r}; a platform admin creates it")
    infeasible = ctx.feasibility.get(
        (spec.resources, spec.sites), lambda _: tuple(check_feasible(spec, ctx.fleet))
    )
    violations = [
        *check_quota(spec, team.quota),
        *check_admission(spec, team.policy, require_digest=ctx.settings.profile == "production"),
        *check_checkpoint_url(
            spec,
            roots_for(spec, team.policy.checkpoint_roots, ctx.checkpoint_stores),
            object_store=ctx.settings.checkpoints_in_object_store,
        ),
        *_missing_secrets(ctx, spec),
        *infeasible,
        *check_data_sites(spec, ctx.fleet),
    ]
    if violations:
        raise SpecRejected(violations)


def _missing_secrets(ctx: ApiContext, spec: JobSpec) -> list[SpecViolation]:
    """Secrets the spec names that its team's store lacks (known here only for the file store)."""
    if not spec.env_from_secret or ctx.secrets is None:
        return []
    held = set(ctx.secrets.names(spec.team))
    return [
        SpecViolation(path=f"env_from_secret.{var}", rule=f"team {spec.team} has no secret named {name!r}")
        for var, name in spec.env_from_secret.items()
        if name not in held
    ]


_IDEMPOTENCY_KEY_PARAMETER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "The same key with the same body returns the same job; with another body, 409.",
}


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobOut,
    responses={200: {"model": JobOut, "description": "Replay: this Idempotency-Key already made this job"}},
    openapi_extra={"parameters": [_IDEMPOTENCY_KEY_PARAMETER]},
)
async def submit_job(spec: JobSpec, request: Request, caller: Principal = Depends(principal)) -> Response:
    """Store the job and its event in one transaction. The same key and body return the same job."""
    # The hot path: the header is read by hand (FastAPI's Header parameter cost more than the
    # insert), and nothing hops to a worker thread unless a cache misses.
    ctx: ApiContext = request.app.state.context
    key = _idempotency_key(request.headers.get("idempotency-key"))
    await _admit(ctx, caller, spec)
    job, created = await ctx.submitter.submit(
        spec, idempotency_key=key, created_by=caller.token_id, at=ctx.clock()
    )
    if created:
        metrics.jobs_submitted.inc()
    return Response(
        JobOut.of(job).model_dump_json(), status_code=201 if created else 200, media_type="application/json"
    )


def _encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(str(seq).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        value = int(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise SpecRejected.one("cursor", "not a cursor this API handed out (use next_cursor)") from None
    if not 0 <= value <= job_store.MAX_SEQ:
        raise SpecRejected.one("cursor", "not a cursor this API handed out (use next_cursor)")
    return value


@router.get("/jobs", response_model=JobPage)
def list_jobs(
    ctx: ApiContext = Depends(context),
    caller: Principal = Depends(principal),
    team: str | None = Query(None, max_length=63),
    state: JobState | None = None,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, max_length=64),
) -> JobPage:
    """Newest first. Members see their team's jobs only; platform admins see every team's."""
    if team is not None and not caller.can_see(team):
        return JobPage(items=[], next_cursor=None)
    teams = [team] if team is not None else (None if caller.is_platform_admin else [caller.team])
    found, next_seq = job_store.page(
        ctx.engine,
        teams=teams,
        state=state,
        limit=limit,
        after_seq=_decode_cursor(cursor) if cursor else None,
    )
    return JobPage(
        items=[JobOut.of(job) for job in found],
        next_cursor=_encode_cursor(next_seq) if next_seq is not None else None,
    )


@router.get("/jobs/{job_id}", response_model=JobDetailOut)
def show_job(
    job_id: str = JobId, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> JobDetailOut:
    """The job with its attempts and its events. Another team's job answers 404, like a missing one."""
    detail = job_store.detail(ctx.engine, job_id)
    if detail is None or not caller.can_see(detail.job.team):
        raise not_found(f"job {job_id}")
    return JobDetailOut.of_detail(detail)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel_job(
    job_id: str = JobId, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> JobOut:
    """A pending job is cancelled at once; a placed one is stopped by its launcher, then CANCELLED."""
    with ctx.engine.connect() as conn:
        job = job_store.get(conn, job_id)
    if job is None or not caller.can_see(job.team):
        raise not_found(f"job {job_id}")
    try:
        return JobOut.of(job_store.cancel(ctx.engine, job_id, at=ctx.clock(), by=caller.token_id))
    except job_store.NotCancellable as error:
        raise Problem(
            409, "Conflict", str(error), kind="/problems/not-cancellable", state=error.job.state
        ) from None
