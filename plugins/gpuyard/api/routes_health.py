"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gpuyard import metrics
from gpuyard.api.auth import ApiContext, context
from gpuyard.api.problems import PROBLEM_RESPONSES, Problem

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: PROBLEM_RESPONSES[503]})
def readyz(ctx: ApiContext = Depends(context)) -> dict[str, str]:
    """The store answers: only then should a load balancer send traffic here."""
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as error:
        raise Problem(503, "Service Unavailable", f"database: {str(error).splitlines()[0]}") from None
    return {"status": "ready"}


@router.get("/metrics", response_class=Response)
def prometheus() -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
