"""Liveness, readiness and Prometheus metrics.

`/healthz` answers on the event loop itself: no worker thread, no database. A database outage
fills the shared thread pool with waiting requests, and a liveness probe that queued behind them
would have the orchestrator restart healthy servers in the middle of the outage.
`/readyz` and `/metrics` read the store, each on a one-thread limiter of its own (never queued
behind user requests); `/readyz` answers 503 when the store does not answer within
`READY_TIMEOUT_S`, and a ping it abandons ends by the store's own bounds (store/db.py).
"""

from __future__ import annotations

import anyio
from anyio import to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gpuyard import metrics
from gpuyard.api.auth import ApiContext, context
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem

router = APIRouter(tags=["health"])

READY_TIMEOUT_S = 2.0


def _limiter(request: Request, name: str) -> anyio.CapacityLimiter:
    """The app's one-thread limiter for `name`, made on first use (it belongs to the running loop)."""
    limiters: dict[str, anyio.CapacityLimiter] | None = getattr(request.app.state, "probe_limiters", None)
    if limiters is None:
        request.app.state.probe_limiters = limiters = {}
    if name not in limiters:
        limiters[name] = anyio.CapacityLimiter(1)
    return limiters[name]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process answers (its event loop runs)."""
    return {"status": "ok"}


def _ping(ctx: ApiContext) -> None:
    with ctx.engine.connect() as conn:
        conn.execute(text("SELECT 1"))


@router.get("/readyz", responses={503: PROBLEM_RESPONSES[503]})
async def readyz(request: Request, ctx: ApiContext = Depends(context)) -> dict[str, str]:
    """The store answers: only then should a load balancer send traffic here."""
    problem = f"database: no answer within {READY_TIMEOUT_S:g}s"
    with anyio.move_on_after(READY_TIMEOUT_S):
        try:
            # abandon_on_cancel: a ping stuck on a black-holed link ends by the store's own bounds.
            await to_thread.run_sync(_ping, ctx, limiter=_limiter(request, "readyz"), abandon_on_cancel=True)
            return {"status": "ready"}
        except SQLAlchemyError as error:
            problem = f"database: {str(error).splitlines()[0]}"
    raise Problem(503, "Service Unavailable", problem)


@router.get("/metrics", response_class=Response)
async def prometheus(request: Request) -> Response:
    body = await to_thread.run_sync(metrics.latest, limiter=_limiter(request, "metrics"))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
