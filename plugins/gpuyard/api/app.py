"""Builds the FastAPI application: routers, error handlers, input guards (body size, NUL in the URL),
request metrics, and the collectors behind /metrics (platform-wide, computed at most every 30 s)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from gpuyard import __version__, metrics
from gpuyard.api import (
    routes_admin,
    routes_attempts,
    routes_events,
    routes_fleet,
    routes_health,
    routes_jobs,
    routes_queue,
)
from gpuyard.api.asgi import HttpMiddleware, on_response_start
from gpuyard.api.body_limit import BodyLimit
from gpuyard.api.context import ApiContext
from gpuyard.api.problems import Problem, handle_problem, problem_response
from gpuyard.api.request_id import RequestId
from gpuyard.api.url_guard import RefuseNulInUrl
from gpuyard.clock import Clock, utcnow
from gpuyard.domain.fleet import Fleet
from gpuyard.domain.spec import SpecRejected, field_path
from gpuyard.domain.states import IllegalTransition, StaleState
from gpuyard.secrets.files import home_store
from gpuyard.settings import Settings
from gpuyard.store import jobs as job_store
from gpuyard.store.db import DbBounds
from gpuyard.store.submitter import submitter_for

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    engine: Engine,
    *,
    fleet: Fleet | None = None,
    logs: Callable[[str, bool], Iterator[str]] | None = None,
    clock: Clock = utcnow,
) -> FastAPI:
    fleet = fleet or settings.fleet()
    context = ApiContext(
        settings=settings,
        engine=engine,
        submitter=submitter_for(
            engine, pool_size=settings.db_pool_size, bounds=DbBounds.from_settings(settings)
        ),
        fleet=fleet,
        clock=clock,
        logs=logs,
        secrets=home_store(settings.home) if settings.launcher == "local" else None,
        checkpoint_stores=settings.checkpoint_stores(fleet),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await context.submitter.open()  # its connections belong to the server's event loop
        try:
            yield
        finally:
            await context.submitter.close()

    app = FastAPI(
        title="gpuyard",
        version=__version__,
        description="GPU job control plane: submit jobs, follow their attempts, manage teams and quotas.",
        lifespan=lifespan,
    )
    app.state.context = context
    for router in (
        routes_jobs.router,
        routes_fleet.router,
        routes_queue.router,
        routes_attempts.router,
        routes_admin.router,
        routes_health.router,
        routes_events.router,
    ):
        app.include_router(router)
    _install_error_handlers(app)
    _register_collectors(app.state.context)
    app.add_middleware(_RequestMetrics)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RefuseNulInUrl)
    app.add_middleware(RequestId)  # outermost: every line of the request, and its answer, carry the id
    return app


_registered: list[Any] = []


def _register_collectors(ctx: ApiContext) -> None:
    # One process-wide registry: the newest app's store answers the scrape.
    for collector in _registered:
        metrics.collectors.unregister(collector)
    _registered.clear()
    for collector in (
        metrics.JobStateCollector(lambda: job_store.count_by_state(ctx.engine)),
        metrics.PlatformCollector(
            lambda: ctx.scrape_summary.get("platform", lambda _: routes_fleet.platform_summary(ctx, 24.0))
        ),
    ):
        metrics.collectors.register(collector)
        _registered.append(collector)


def _install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Problem, handle_problem)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        if isinstance(error, SpecRejected):
            errors = [{"path": v.path, "rule": v.rule} for v in error.violations]
        else:
            assert isinstance(error, RequestValidationError)
            errors = [
                {"path": _request_path(item["loc"]), "rule": str(item["msg"]).removeprefix("Value error, ")}
                for item in error.errors()
            ]
        detail = "; ".join(f"{e['path']}: {e['rule']}" for e in errors)
        return problem_response(
            Problem(422, "Invalid request", detail, kind="/problems/invalid", errors=errors), request.url.path
        )

    async def unavailable(request: Request, error: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", str(error).splitlines()[0])
        return problem_response(
            Problem(
                503,
                "Service Unavailable",
                "the database is unreachable; nothing was changed, retry later",
                kind="/problems/database-unavailable",
                headers={"Retry-After": "1"},
            ),
            request.url.path,
        )

    async def conflict(request: Request, error: Exception) -> JSONResponse:
        return problem_response(
            Problem(409, "Conflict", str(error), kind="/problems/conflict"), request.url.path
        )

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        return problem_response(
            Problem(
                error.status_code,
                str(error.detail),
                str(error.detail),
                headers=dict(error.headers) if error.headers else None,
            ),
            request.url.path,
        )

    async def database_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, DBAPIError)
        if error.connection_invalidated or isinstance(error, OperationalError):
            return await unavailable(request, error)
        raise error

    app.add_exception_handler(SpecRejected, invalid)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(OperationalError, unavailable)
    app.add_exception_handler(psycopg.OperationalError, unavailable)  # the submitter's (PoolTimeout too)
    app.add_exception_handler(PoolTimeout, unavailable)
    app.add_exception_handler(DBAPIError, database_error)
    app.add_exception_handler(job_store.IdempotencyConflict, conflict)
    app.add_exception_handler(IllegalTransition, conflict)
    app.add_exception_handler(StaleState, conflict)
    app.add_exception_handler(HTTPException, http_error)


def _request_path(loc: tuple[int | str, ...]) -> str:
    where, *rest = loc if loc else ("body",)
    path = field_path(tuple(rest))
    return path if where == "body" else f"{where}.{path}" if rest else str(where)


class _RequestMetrics(HttpMiddleware):
    """Counts and times requests by route template (not raw path, which would explode cardinality)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500

        def record_status(start: Message) -> None:
            nonlocal status
            status = start["status"]

        try:
            await self.app(scope, receive, on_response_start(send, record_status))
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            metrics.http_requests.labels(scope["method"], route, str(status)).inc()
            metrics.http_latency.labels(route).observe(time.perf_counter() - started)
