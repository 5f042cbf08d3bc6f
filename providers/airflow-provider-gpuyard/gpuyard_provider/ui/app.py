"""The gpuyard page's FastAPI app: the plugin mounts it in Airflow's API server at /gpuyard, and Airflow's
navigation shows it (an external view). It can also run on its own (`create_app(api_url=...)`).

It talks to the control plane only through `gpuyard_client`, as the caller, so a member sees only
their team's jobs and figures. Who the caller is: a person who signed in with their gpuyard token
(kept in an HttpOnly cookie scoped to the page); else, inside Airflow, the signed-in Airflow user,
for whom the page mints a short-lived token of the team and role the platform's sign-in mapping
gives them (`sign_in`). A token the API refuses signs the caller out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, quote

import httpx
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from gpuyard_client import ApiError, Endpoint, GpuyardClient
from starlette.concurrency import run_in_threadpool

from gpuyard_provider.ui import mlflow_links, pages, sign_in
from gpuyard_provider.ui.sign_in import AirflowUser, Delegation, Grant, MappingError, SignInSettings

COOKIE = "gpuyard_token"
FRAGMENT_HEADER = "x-gpuyard-fragment"  # the page's script refreshes <main> alone
LOG_LINES = 200
RECENT_JOBS = 15
STATIC = Path(__file__).with_name("static")


class SignedOut(Exception):
    """No token, or one the API refused."""


@dataclass(frozen=True)
class Caller:
    """Whom a request reads as: `token`, the signed-in person's or one minted for `airflow_user` (then
    `grant` says which team and role); `notice` says why an Airflow user got no token."""

    token: str | None = None
    airflow_user: AirflowUser | None = None
    grant: Grant | None = None
    notice: str | None = None


def create_app(
    api_url: Callable[[], str],
    *,
    airflow_url: str = "",
    mlflow_ui_url: Callable[[], str | None] = lambda: None,
    airflow_user: Callable[[Request], Awaitable[AirflowUser | None]] | None = None,
    sign_in_settings: Callable[[], SignInSettings | None] = lambda: None,
) -> FastAPI:
    """`api_url`: where the gpuyard API is (read per request: the connection may change);
    `airflow_url`: the Airflow UI's root for task links ("" when mounted in Airflow itself);
    `airflow_user`: who is signed in to Airflow (None: the page runs alone, tokens only);
    `sign_in_settings`: the mapping and delegation token (read per request; None: none configured,
    MappingError: a malformed one)."""
    app = FastAPI(title="gpuyard page", docs_url=None, redoc_url=None, openapi_url=None)
    delegation = Delegation()
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def refused(token: str) -> str | None:
        """Why the API does not take `token`, or None when it does."""
        if not token:
            return "token: enter a gpuyard token"
        try:
            with GpuyardClient(Endpoint(api_url().rstrip("/"), token), timeout_s=15.0, retry_for_s=1.0) as c:
                c.whoami()
        except ApiError as error:
            return f"token: the gpuyard API refused it ({error.status})"
        except httpx.TransportError as away:
            return f"the gpuyard API at {api_url()} is away: {away}"
        return None

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def caller(request: Request) -> Caller:
        """The signed-in person's token; else a token minted for the Airflow user; else none."""
        if token := request.cookies.get(COOKIE):
            return Caller(token=token)
        user = await airflow_user(request) if airflow_user is not None else None
        if user is None:
            return Caller()
        return await run_in_threadpool(delegate, user)  # reads a connection, may call the API

    def delegate(user: AirflowUser) -> Caller:
        try:
            settings = sign_in_settings()
        except MappingError as error:
            return Caller(airflow_user=user, notice=f"connection {sign_in.CONNECTION}: {error}")
        grant = sign_in.grant_for(settings.mapping, user) if settings is not None else None
        if settings is None or grant is None:
            roles = ", ".join(user.roles) or "none"
            return Caller(
                airflow_user=user,
                notice=f"Airflow user {user.name} (roles: {roles}) has no gpuyard team in this Airflow's "
                f"sign-in mapping (connection {sign_in.CONNECTION}): sign in with a gpuyard token",
            )
        url = api_url().rstrip("/")

        def mint(expires_at: datetime) -> str:
            endpoint = Endpoint(url, settings.credential)
            with GpuyardClient(endpoint, timeout_s=15.0, retry_for_s=1.0) as c:
                description = f"gpuyard page in Airflow, for Airflow user {user.name} ({grant.source})"
                made = c.create_token(
                    grant.team, grant.role, description=description[:200], expires_at=expires_at
                )
            return str(made["token"])

        key = Delegation.key(user, grant, url, settings.credential)
        try:
            token = delegation.token(key, settings.mapping.token_minutes, mint)
        except ApiError as error:
            return Caller(
                airflow_user=user,
                grant=grant,
                notice=f"the gpuyard API refused to mint a token of team {grant.team}, role {grant.role} "
                f"for Airflow user {user.name} ({error}): the token of connection {sign_in.CONNECTION} "
                "may not mint it",
            )
        except httpx.TransportError as away:
            return Caller(airflow_user=user, grant=grant, notice=f"the gpuyard API at {url} is away: {away}")
        return Caller(token=token, airflow_user=user, grant=grant)

    @contextmanager
    def client(who: Caller) -> Iterator[GpuyardClient]:
        if not who.token:
            raise SignedOut
        with GpuyardClient(Endpoint(api_url().rstrip("/"), who.token), timeout_s=15.0, retry_for_s=1.0) as c:
            try:
                yield c
            except ApiError as error:
                if error.status == 401:
                    delegation.forget(who.token)  # a minted token revoked: the next request mints anew
                    raise SignedOut from None
                raise

    def page(request: Request, who: Caller, title: str, render: Callable[[GpuyardClient], str]) -> Response:
        shown = None  # kept when only the render fails: the navigation stays
        try:
            with client(who) as c:
                shown = c.whoami() | ({"airflow_user": who.airflow_user.name} if who.airflow_user else {})
                body = render(c)
        except SignedOut:
            response = RedirectResponse(f"{base(request)}/sign-in", status_code=303)
            response.delete_cookie(COOKIE, path=base(request) or "/")
            return response
        except ApiError as error:
            body = f'<p class="error">{pages.e(error)}</p>'
        except httpx.TransportError as error:
            body = f'<p class="error">the gpuyard API at {pages.e(api_url())} is away: {pages.e(error)}</p>'
        if request.headers.get(FRAGMENT_HEADER):
            return HTMLResponse(body)
        return HTMLResponse(pages.layout(base(request), title, body, shown))

    @app.get("/", response_class=HTMLResponse)
    def dashboard(
        request: Request,
        team: str | None = Query(None, max_length=63),
        reason: str | None = Query(None, max_length=32),  # the API checks it
        offset: int = Query(0, ge=0, le=10_000_000),
        limit: int = Query(50, ge=1, le=500),
        who: Caller = Depends(caller),
    ) -> Response:
        filters = {"team": team, "reason": reason, "offset": offset, "limit": limit if limit != 50 else None}

        def render(c: GpuyardClient) -> str:
            queue = c.queue(team=team or None, reason=reason or None, offset=offset, limit=limit)
            recent = list(c.jobs(team=team or None, limit=RECENT_JOBS))
            return pages.dashboard(base(request), queue, c.fleet(), filters, recent)

        return page(request, who, "queue and fleet", render)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job(
        request: Request,
        job_id: str,
        attempt: int | None = Query(None, ge=1, le=100_000),
        who: Caller = Depends(caller),
    ) -> Response:
        def render(c: GpuyardClient) -> str:
            found = c.job(job_id)
            waiting = c.queue(job=job_id)["items"] if found["state"] == "PENDING" else []
            numbers = [a["number"] for a in found.get("attempts") or []]
            shown = attempt if attempt in numbers else (numbers[-1] if numbers else None)
            return pages.job_page(
                base(request),
                found,
                datetime.now(UTC),
                (shown, _logs(c, job_id, shown)),
                job_links(found, airflow_url, mlflow_ui_url()),
                waiting[0] if waiting else None,
            )

        return page(request, who, job_id, render)

    @app.get("/figures", response_class=HTMLResponse)
    def figures(
        request: Request,
        hours: float = Query(24.0, ge=1 / 60, le=24.0 * 366),
        who: Caller = Depends(caller),
    ) -> Response:
        def render(c: GpuyardClient) -> str:
            series = c.metrics_series(hours=hours, steps=48)
            return pages.figures(base(request), series, c.metrics_summary(hours=hours))

        return page(request, who, "figures", render)

    @app.get("/sign-in", response_class=HTMLResponse)
    def sign_in_form(request: Request, who: Caller = Depends(caller)) -> Response:
        body = pages.sign_in(base(request), None, through_airflow(who))
        return HTMLResponse(pages.layout(base(request), "sign in", body, None, 0))

    @app.post("/sign-in", response_class=HTMLResponse)
    async def sign_in_with_token(request: Request, who: Caller = Depends(caller)) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        error = await run_in_threadpool(refused, token)  # the client blocks: not on the event loop
        if error:
            body = pages.sign_in(base(request), error, through_airflow(who))
            return HTMLResponse(pages.layout(base(request), "sign in", body, None, 0), status_code=401)
        response = RedirectResponse(f"{base(request)}/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=base(request) or "/")
        return response

    @app.get("/sign-out")
    def sign_out(request: Request) -> Response:
        response = RedirectResponse(f"{base(request)}/sign-in", status_code=303)
        response.delete_cookie(COOKIE, path=base(request) or "/")
        return response

    return app


def through_airflow(who: Caller) -> dict[str, str] | None:
    """What the sign-in page says of the Airflow user: signed in as whom, or why not."""
    if who.airflow_user is None:
        return None
    said = {"user": who.airflow_user.name}
    if who.notice:
        return said | {"notice": who.notice}
    if who.grant is not None and who.token:
        return said | {"team": who.grant.team, "role": who.grant.role}
    return None


def job_links(found: dict, airflow_url: str, mlflow_ui: str | None) -> dict[str, str]:  # type: ignore[type-arg]
    """The Airflow task that submitted the job (from its labels) and its MLflow run (its tracking store)."""
    labels = found["spec"].get("labels") or {}
    links = {}
    keys = ("airflow.dag_id", "airflow.run_id", "airflow.task_id")
    if set(keys) <= labels.keys():
        dag, run, task = (quote(labels[k], safe="") for k in keys)
        url = f"{airflow_url.rstrip('/')}/dags/{dag}/runs/{run}/tasks/{task}"
        if labels.get("airflow.map_index", "-1") != "-1":
            url += f"/mapped/{quote(labels['airflow.map_index'], safe='')}"
        links["Airflow task"] = url
    tracking = (found["spec"].get("env") or {}).get("MLFLOW_TRACKING_URI")
    if mlflow_ui and tracking and (link := mlflow_links.run_link(tracking, mlflow_ui, found["id"])):
        links["MLflow run"] = link
    return links


def _logs(c: GpuyardClient, job_id: str, attempt: int | None) -> list[str] | None:
    """An attempt's last lines; None when there is no attempt or the launcher keeps no logs."""
    if attempt is None:
        return None
    try:
        return list(deque(c.logs(job_id, attempt=attempt), maxlen=LOG_LINES))
    except ApiError:
        return None


def plugin_app() -> FastAPI:
    """The app the Airflow plugin mounts: the API's URL and MLflow's UI from the `gpuyard_default`
    connection (its `mlflow_ui_url` extra), task links relative to this Airflow, the Airflow user
    from Airflow's JWT and the sign-in mapping from the `gpuyard_sign_in` connection."""
    from gpuyard_provider.hooks.gpuyard import GpuyardHook

    return create_app(
        lambda: GpuyardHook().api_url(),
        mlflow_ui_url=lambda: GpuyardHook().extra("mlflow_ui_url"),
        airflow_user=sign_in.airflow_user,
        sign_in_settings=sign_in_settings,
    )


def sign_in_settings() -> SignInSettings | None:
    """The `gpuyard_sign_in` connection's mapping and delegation token; None when there is none."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from gpuyard_provider.hooks.gpuyard import GpuyardHook

    try:
        conn = GpuyardHook.get_connection(sign_in.CONNECTION)
    except AirflowNotFoundException:
        return None
    return sign_in.settings_of(conn.password, conn.extra)
