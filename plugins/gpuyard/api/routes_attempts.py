"""/v1/attempts: workers renew their leases and report progress and checkpoints; admins preempt.

A worker proves its attempt with the attempt's secret, sent as `Authorization: Bearer <secret>`
(handed to it by the launcher, shown by no response, cleared when the attempt ends). A missing or
wrong secret, an unknown attempt and an ended one all answer the same 401, and the worker must stop:
a zombie cannot overwrite its successor. The fencing token orders writes: with the right secret, a
token not the attempt's is 409, stop. A worker may record only checkpoints under its own job's
checkpoint roots (domain/checkpoint_roots.py).
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from gpuyard.api.auth import (
    ApiContext,
    attempt_secret,
    context,
    principal,
    require_platform_admin,
    unauthorized,
)
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem, not_found
from gpuyard.domain.retry import young_daly_interval_s
from gpuyard.domain.states import StopReason
from gpuyard.store import attempts as attempt_store
from gpuyard.store import interruptions
from gpuyard.store.teams import Principal

# Steps and checkpoint steps are stored as BIGINT.
MAX_STEP = 2**63 - 1
MAX_SPAN_S = 366 * 86400.0  # a reported duration beyond a year is a broken clock, not a fact
UNKNOWN_NODE_MTBI_S = 24 * 3600.0  # a node the fleet does not list (it left): taken as a spot node

router = APIRouter(prefix="/v1", tags=["workers"], responses=PROBLEM_RESPONSES)


class CheckpointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    step: int = Field(ge=0, le=MAX_STEP)
    saved_at: datetime | None = None
    cost_s: float | None = Field(None, ge=0, le=86400)
    bytes: int | None = Field(
        None, ge=0, le=MAX_STEP, description="Its size, all files: what moving it to another site copies"
    )


class RestoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, le=MAX_STEP, description="The checkpoint step the workers restored")
    seconds: float = Field(ge=0, le=MAX_SPAN_S, description="How long finding and loading it took")


MAX_BATCH = 2**31 - 1  # the store's integers


class ThroughputIn(BaseModel):
    """The workers' newest measure of their steps: what an elastic job's sizing reads."""

    model_config = ConfigDict(extra="forbid")

    step_s: float = Field(gt=0, le=MAX_SPAN_S, description="Seconds of one optimizer step, measured")
    local_batch: int = Field(ge=1, le=MAX_BATCH, description="Each worker's micro-batch")
    accum_steps: int = Field(ge=1, le=MAX_BATCH, description="Micro-batches accumulated per step")
    global_batch: int = Field(ge=1, le=MAX_BATCH, description="Examples per optimizer step, all workers")


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fencing_token: int = Field(ge=0, le=MAX_STEP)
    step: int | None = Field(None, ge=0, le=MAX_STEP)
    checkpoint: CheckpointIn | None = None
    metrics: dict[str, float] = Field(default_factory=dict, max_length=64)
    # What the accounting needs of the attempt (docs/metrics.md); workers that resumed nothing send
    # no `restore`, and a plain command neither.
    restore: RestoreIn | None = None
    checkpoint_stall_s: float | None = Field(
        None, ge=0, le=MAX_SPAN_S, description="Seconds the steps paused for checkpoint writes, all told"
    )
    # Optional: workers from before it, and plain commands, send none.
    throughput: ThroughputIn | None = None


class HeartbeatOut(BaseModel):
    lease_expires_at: datetime
    lease_seconds: float = Field(description="The lease period: a worker not renewed within it stops writing")
    action: str = Field(description="continue | checkpoint_and_stop (401 and 409 answers: stop)")
    checkpoint_interval_s: float | None = Field(
        None, description="Young/Daly interval for checkpoint interval 'auto', once the cost is measured"
    )


def _beat(ctx: ApiContext, attempt_id: str, secret: str, body: HeartbeatIn) -> HeartbeatOut:
    now = ctx.clock()
    checkpoint = None
    if body.checkpoint is not None:
        checkpoint = body.checkpoint.model_dump()
        checkpoint["saved_at"] = checkpoint["saved_at"] or now
    try:
        beat = attempt_store.heartbeat(
            ctx.engine,
            attempt_id,
            body.fencing_token,
            secret=secret,
            step=body.step,
            checkpoint=checkpoint,
            at=now,
            lease_ttl_s=ctx.settings.lease_seconds,
            stores=ctx.checkpoint_stores,
            restore=body.restore.model_dump() if body.restore is not None else None,
            checkpoint_stall_s=body.checkpoint_stall_s,
            throughput=body.throughput.model_dump() if body.throughput is not None else None,
        )
    except attempt_store.Unproven:
        raise unauthorized(
            "send the attempt's secret as 'Authorization: Bearer <secret>': it is missing or wrong, "
            "or the attempt is unknown or has ended; stop without writing"
        ) from None
    except attempt_store.StaleToken as error:
        raise Problem(
            409, "Stale fencing token", f"{error}; stop without writing", kind="/problems/stale-token"
        ) from None
    except attempt_store.CheckpointRefused as error:
        raise Problem(
            422,
            "Checkpoint refused",
            str(error),
            kind="/problems/validation",
            errors=[
                {
                    "path": "checkpoint.url",
                    "rule": "must lie under the job's checkpoint.url or its folder under its team's "
                    "checkpoint roots",
                }
            ],
        ) from None
    interval = None
    policy = beat.job.spec.checkpoint
    if policy is not None and policy.interval == "auto" and beat.job.checkpoint_cost_s:
        nodes = {n["node"] for n in beat.attempt.placement.get("nodes", [])}
        listed = {n.name: n.expected_mtbi_s for n in ctx.fleet.nodes if n.name in nodes}
        priors = dict.fromkeys(nodes, UNKNOWN_NODE_MTBI_S) | listed
        with ctx.engine.connect() as conn:
            mtbi = interruptions.attempt_mtbi_s(conn, priors, now)
        interval = young_daly_interval_s(beat.job.checkpoint_cost_s, mtbi)
    elif policy is not None:
        interval = policy.interval_seconds
    return HeartbeatOut(
        lease_expires_at=beat.lease_expires_at,
        lease_seconds=ctx.settings.lease_seconds,
        action=beat.action,
        checkpoint_interval_s=interval,
    )


@router.post("/attempts/{attempt_id}/heartbeat", response_model=HeartbeatOut)
async def heartbeat(
    attempt_id: str,
    body: HeartbeatIn,
    ctx: ApiContext = Depends(context),
    secret: str = Depends(attempt_secret),
) -> HeartbeatOut:
    """Workers: renew the attempt's leases; record step and newest durable checkpoint; say whether to
    go on. Authorization: Bearer <the attempt's secret> (GPUYARD_ATTEMPT_SECRET); 401: stop."""
    return await run_in_threadpool(_beat, ctx, attempt_id, secret, body)


class PreemptOut(BaseModel):
    attempt_id: str
    stop_requested: str


def _preempt(ctx: ApiContext, attempt_id: str, by: str) -> PreemptOut:
    asked = attempt_store.request_stop(
        ctx.engine, attempt_id, at=ctx.clock(), why=f"preempted by {by}", kind=StopReason.PREEMPT
    )
    with ctx.engine.connect() as conn:
        found = attempt_store.attempt(conn, attempt_id)
    if found is None:
        raise not_found(f"attempt {attempt_id}")
    if not asked and found.stop_requested is None:
        raise Problem(409, "Attempt ended", f"attempt {attempt_id} is already {found.state.value}")
    return PreemptOut(attempt_id=attempt_id, stop_requested=str(found.stop_requested))


@router.post("/attempts/{attempt_id}/preempt", response_model=PreemptOut, status_code=202)
async def preempt(
    attempt_id: str, ctx: ApiContext = Depends(context), caller: Principal = Depends(principal)
) -> PreemptOut:
    """Platform admins: ask a live attempt to checkpoint and stop, as an eviction would. Its workers
    get SIGTERM from the scheduler; the job resumes from that checkpoint, its retry budget untouched."""
    require_platform_admin(caller)
    return await run_in_threadpool(_preempt, ctx, attempt_id, caller.token_id)
