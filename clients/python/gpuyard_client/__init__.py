"""gpuyard's HTTP client: what the CLI, the Airflow provider (airflow-provider-gpuyard) and scripts use.
Never the internals: it stands alone (httpx and tenacity), so the provider installs without gpuyard.

It finds the server through an explicit URL and token, `GPUYARD_URL`/`GPUYARD_TOKEN`, or the
files an embedded instance (`gpuyard up`) writes into its home.

It rides out an outage of the API (a restart, a rolling update): a request that is safe to repeat
is tried again, with exponential backoff and jitter, never sooner than the server's Retry-After,
until it succeeds or the outage has lasted `retry_for_s` (`GPUYARD_CLIENT_OUTAGE_S`, 300 s), then
ApiUnreachable names the endpoint and how long it was away. A followed log resumes where it broke.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import math
import os
import re
import ssl
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
import tenacity

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
SERVER_FILE = "server.json"
ADMIN_TOKEN_FILE = "admin.token"
OUTAGE_ENV = "GPUYARD_CLIENT_OUTAGE_S"
DEFAULT_OUTAGE_S = 300.0
MAX_BACKOFF_S = 5.0  # the API is found again within this long of its return
# Answers that say the API is away for now. 429 and 503 come before it acted (the API's 503: its
# database is unreachable, nothing was changed); 502 and 504 come from a proxy, maybe after.
AWAY_STATUSES = frozenset({429, 502, 503, 504})
NOT_ACTED_STATUSES = frozenset({429, 503})
REPEATABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
LOG_ATTEMPT_HEADER = "Gpuyard-Attempt"  # which attempt a logs answer streams: a resumed read pins it

log = logging.getLogger(__name__)


class ApiError(Exception):
    """The server said no; `problem` is its problem-details body."""

    def __init__(self, status: int, problem: dict[str, Any]):
        self.status, self.problem = status, problem
        lines = [f"{problem.get('title', 'Error')} ({status}): {problem.get('detail', '')}"]
        lines += [f"  - {e['path']}: {e['rule']}" for e in problem.get("errors") or []]
        super().__init__("\n".join(lines))


class ApiUnreachable(httpx.TransportError):
    """The API stayed away (refused, reset, timed out, or answered 429/502/503/504) past the deadline."""

    def __init__(self, url: str, request: str, away_s: float, last: BaseException):
        self.url, self.away_s = url, away_s
        super().__init__(
            f"the gpuyard API at {url} was unreachable for {away_s:.0f} s ({request}: {_said(last)}); "
            f"gave up (the deadline is ${OUTAGE_ENV} or --retry-for)"
        )


class NotConfigured(Exception):
    pass


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str


def resolve_endpoint(url: str | None = None, token: str | None = None, home: Path | None = None) -> Endpoint:
    """Explicit values win, then the environment, then the embedded instance in `home`."""
    url = url or os.environ.get("GPUYARD_URL")
    token = token or os.environ.get("GPUYARD_TOKEN")
    home = home or Path(os.environ.get("GPUYARD_HOME") or Path.home() / ".gpuyard")
    if url is None:
        server = home / SERVER_FILE
        if not server.exists():
            raise NotConfigured(
                f"no server: pass --url (or set GPUYARD_URL), or start one with `gpuyard up --home {home}`"
            )
        url = json.loads(server.read_text())["url"]
    if token is None:
        token_file = home / ADMIN_TOKEN_FILE
        if not token_file.exists():
            raise NotConfigured(f"no token: pass --token (or set GPUYARD_TOKEN); {token_file} does not exist")
        token = token_file.read_text().strip()
    return Endpoint(url=url.rstrip("/"), token=token)


def outage_s(value: float | str | None = None) -> float:
    """How long a client rides out an outage: `value`, else $GPUYARD_CLIENT_OUTAGE_S, else 300 s."""
    raw = os.environ.get(OUTAGE_ENV, DEFAULT_OUTAGE_S) if value is None else value
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 7 * 24 * 3600:
        source = OUTAGE_ENV if value is None else "the retry deadline"
        raise NotConfigured(f"{source}: expected seconds from 0 to 604800, got {raw!r}")
    return seconds


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS context, what httpx builds for each client by default (the CA bundle, or
    SSL_CERT_FILE / SSL_CERT_DIR): building it costs about 20 ms of CPU, which every short-lived
    client paid (a poll that opens a client per request spent most of its CPU there). Other clients
    of the process pass it too (`verify=tls_context()`)."""
    return httpx.create_ssl_context()


def _http_options(endpoint: Endpoint, timeout_s: float) -> dict[str, Any]:
    """What both clients' httpx client is made with: the server, the bearer token, the timeout."""
    return {
        "base_url": endpoint.url,
        "headers": {"Authorization": f"Bearer {endpoint.token}"},
        "timeout": timeout_s,
        "verify": tls_context(),
    }


# -- riding out an outage: pure policy --------------------------------------------------------------


class Away(Exception):
    """An answer that says the API is away for now (AWAY_STATUSES), raised so that it is retried."""

    def __init__(self, response: httpx.Response):
        self.response = response
        super().__init__(f"{response.status_code} {response.reason_phrase}")


def repeatable(method: str, headers: Mapping[str, str] | None) -> bool:
    """May this request run twice? Reads, PUTs and DELETEs may; a POST with an Idempotency-Key
    may (the server returns the first one's job)."""
    return method.upper() in REPEATABLE_METHODS or "Idempotency-Key" in (headers or {})


def worth_retrying(error: BaseException, is_repeatable: bool) -> bool:
    """Is this failure an outage worth another try? A request that never reached the server (refused,
    no connection in time) or that the server refused before acting (429, 503) always is; one that
    may have been acted on (a reset or a timeout after sending, a proxy's 502/504) only if it is
    repeatable. Any other answer (4xx) and any other error (a bad URL) are not."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    if isinstance(error, Away):
        return is_repeatable or error.response.status_code in NOT_ACTED_STATUSES
    return is_repeatable and isinstance(
        error, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError
    )


def retry_after_s(response: httpx.Response, now: datetime | None = None) -> float:
    """The server's Retry-After in seconds (a number or an HTTP date); 0 when absent or unreadable."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class BackoffOrRetryAfter(tenacity.wait.wait_base):
    """Exponential backoff with full jitter, but never sooner than a Retry-After, nor past the deadline."""

    def __init__(self, deadline_s: float, max_backoff_s: float = MAX_BACKOFF_S) -> None:
        self.deadline_s = deadline_s
        self.backoff = tenacity.wait_random_exponential(multiplier=0.5, max=max_backoff_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = self.backoff(retry_state)
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, Away):
            wait = max(wait, retry_after_s(error.response))
        left = self.deadline_s - (retry_state.seconds_since_start or 0.0)
        return max(0.0, min(wait, left))


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if not isinstance(error, Away) else str(error)


def _raise_if_away(response: httpx.Response) -> httpx.Response:
    if response.status_code in AWAY_STATUSES:
        raise Away(response)
    return response


@dataclass(frozen=True)
class RetryPolicy:
    """How one client rides out an outage: for how long, and whom it tells that it waits."""

    url: str
    retry_for_s: float
    notify: Callable[[str], None]

    def kwargs(self, method: str, path: str, headers: Mapping[str, str] | None) -> dict[str, Any]:
        """tenacity's arguments for one request (the same for its sync and asyncio retrying)."""
        request = f"{method} {path}"
        is_repeatable = repeatable(method, headers)

        def tell(state: tenacity.RetryCallState) -> None:
            if state.attempt_number == 1:  # once per outage a request meets, not once per try
                error = state.outcome.exception() if state.outcome else None
                self.notify(
                    f"gpuyard API at {self.url} unreachable ({request}: {_said(error or Exception())}); "
                    f"retrying for up to {self.retry_for_s:.0f} s"
                )

        def give_up(state: tenacity.RetryCallState) -> Any:
            error = state.outcome.exception() if state.outcome else None
            assert error is not None, "tenacity gives up on failures only"
            raise ApiUnreachable(self.url, request, state.seconds_since_start or 0.0, error) from error

        return {
            "retry": tenacity.retry_if_exception(lambda error: worth_retrying(error, is_repeatable)),
            "stop": tenacity.stop_after_delay(self.retry_for_s),
            "wait": BackoffOrRetryAfter(self.retry_for_s),
            "before_sleep": tell,
            "retry_error_callback": give_up,
        }


def _answer(response: httpx.Response) -> Any:
    """The body of a success (None when empty); a 4xx or 5xx is raised as ApiError."""
    if response.status_code >= 400:
        try:
            problem = response.json()
        except ValueError:
            problem = {"title": response.reason_phrase, "detail": response.text[:500]}
        raise ApiError(response.status_code, problem)
    return response.json() if response.content else None


def _unwrap(error: BaseException) -> BaseException:
    """An Away that was not retried is the server's answer: its ApiError."""
    if isinstance(error, Away):
        try:
            _answer(error.response)
        except ApiError as answer:
            return answer
    return error


# -- a log's read position: what the client counts and the API skips --------------------------------

_RANK_LABEL = re.compile(r"\[(?:node-rank |rank)(\d+)\] ")
_LOG_OFFSET = re.compile(r"\d*:\d+(,\d*:\d+)*")


def log_line_rank(line: str) -> str:
    """The rank a line of a gang's log is labelled with (`[rank1] `, `[node-rank 1] `); "" if none.
    A rank's lines keep their order however the ranks interleave, so a read position counts per rank."""
    match = _RANK_LABEL.match(line)
    return match.group(1) if match else ""


def log_offset(read: Mapping[str, int]) -> str:
    """The `offset` of GET /v1/jobs/{id}/logs: `RANK:LINES,...` (`:LINES` for unlabelled lines)."""
    return ",".join(f"{rank}:{count}" for rank, count in sorted(read.items()))


def parse_log_offset(offset: str) -> dict[str, int]:
    """`log_offset`'s inverse; a malformed one is refused, naming the expected form."""
    if not offset:
        return {}
    if not _LOG_OFFSET.fullmatch(offset):
        raise ValueError(f"offset: expected RANK:LINES,... (e.g. 0:12,1:7, or :12), got {offset[:100]!r}")
    pairs = (item.rpartition(":") for item in offset.split(","))
    return {rank: int(count) for rank, _, count in pairs}


HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)


class _Connection(Generic[HttpT]):
    """An endpoint, its HTTP client (`_transport`: sync or asyncio) and its retry policy.
    `retry_for_s` (default $GPUYARD_CLIENT_OUTAGE_S, else 300 s) bounds how long an outage is ridden
    out; `notify` hears, once per request that meets one, that it is (default: a warning of the
    `gpuyard_client` logger)."""

    _transport: type[HttpT]

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float = 30.0,
        retry_for_s: float | None = None,
        notify: Callable[[str], None] | None = None,
    ):
        self.endpoint = endpoint
        self.policy = RetryPolicy(endpoint.url, outage_s(retry_for_s), notify or log.warning)
        self._http = self._transport(**_http_options(endpoint, timeout_s))


class GpuyardClient(_Connection[httpx.Client]):
    """The API's calls."""

    _transport = httpx.Client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GpuyardClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, method: str, path: str, *, stream: bool = False, **kwargs: Any) -> httpx.Response:
        """One request, tried again while the API is away (see RetryPolicy)."""

        def once() -> httpx.Response:
            response = self._http.send(self._http.build_request(method, path, **kwargs), stream=stream)
            if response.status_code in AWAY_STATUSES and stream:
                response.read()  # the problem body, then the connection goes back to the pool
                response.close()
            return _raise_if_away(response)

        retrying = tenacity.Retrying(**self.policy.kwargs(method, path, kwargs.get("headers")))
        try:
            return retrying(once)  # type: ignore[no-any-return]
        except Away as error:  # not worth retrying: the answer it is
            raise _unwrap(error) from None

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return _answer(self._send(method, path, **kwargs))

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job. Every try sends the same Idempotency-Key (a fresh one unless given): a try
        whose answer was lost in an outage and the one after it make one job."""
        key = idempotency_key or str(uuid.uuid4())
        return self._call("POST", "/v1/jobs", json=spec, headers={"Idempotency-Key": key})  # type: ignore[no-any-return]

    def jobs(
        self, *, team: str | None = None, state: str | None = None, limit: int = 50
    ) -> Iterator[dict[str, Any]]:
        """Every matching job, newest first, following the cursor; stops after `limit`."""
        params: dict[str, Any] = {"limit": min(limit, 500)}
        if team:
            params["team"] = team
        if state:
            params["state"] = state
        seen = 0
        while True:
            page = self._call("GET", "/v1/jobs", params=params)
            for item in page["items"]:
                yield item
                seen += 1
                if seen >= limit:
                    return
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    def preempt_attempt(self, attempt_id: str) -> dict[str, Any]:
        """Platform admins: the attempt checkpoints and stops; its job resumes on a next attempt."""
        return self._call("POST", f"/v1/attempts/{attempt_id}/preempt")  # type: ignore[no-any-return]

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends; `on_change` sees every new state. Raises TimeoutError."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_state = None
        while True:
            job = self.job(job_id)
            if job["state"] != last_state:
                last_state = job["state"]
                if on_change:
                    on_change(job)
            if job["state"] in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout_s}s")
            time.sleep(poll_s)

    def logs(self, job_id: str, *, attempt: int | None = None, follow: bool = False) -> Iterator[str]:
        """The workers' output, line by line; with `follow`, streamed until the attempt ends.

        A stream that breaks (the API restarts) is opened again at the attempt it was reading and
        the lines already read (`offset`), so no line is told twice or skipped; an API away longer
        than the deadline raises ApiUnreachable."""
        read: dict[str, int] = {}
        broken_since: float | None = None
        while True:
            params: dict[str, Any] = {"follow": follow}
            if attempt is not None:
                params["attempt"] = attempt
            if read:
                params["offset"] = log_offset(read)
            response = self._send("GET", f"/v1/jobs/{job_id}/logs", stream=True, params=params, timeout=None)
            try:
                if response.status_code >= 400:
                    response.read()
                    _answer(response)
                if LOG_ATTEMPT_HEADER in response.headers:  # a resumed read stays on this attempt
                    attempt = int(response.headers[LOG_ATTEMPT_HEADER])
                for line in response.iter_lines():
                    broken_since = None
                    rank = log_line_rank(line)
                    read[rank] = read.get(rank, 0) + 1
                    yield line
                return
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as error:
                now = time.monotonic()
                if broken_since is None:
                    broken_since = now
                    self.policy.notify(
                        f"gpuyard API at {self.endpoint.url}: the log stream broke ({_said(error)}); "
                        f"resuming for up to {self.policy.retry_for_s:.0f} s"
                    )
                if now - broken_since >= self.policy.retry_for_s:
                    request = f"GET /v1/jobs/{job_id}/logs"
                    raise ApiUnreachable(self.endpoint.url, request, now - broken_since, error) from error
            finally:
                response.close()

    def fleet(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/fleet")  # type: ignore[no-any-return]

    def queue(
        self,
        *,
        team: str | None = None,
        reason: str | None = None,
        job: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of the waiting jobs in queue order, each with why it waits, and the teams' use."""
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        for key, value in (("team", team), ("reason", reason), ("job", job)):
            if value:
                params[key] = value
        return self._call("GET", "/v1/queue", params=params)  # type: ignore[no-any-return]

    def metrics_summary(self, *, hours: float = 24.0 * 7) -> dict[str, Any]:
        return self._call("GET", "/v1/metrics/summary", params={"hours": hours})  # type: ignore[no-any-return]

    def metrics_series(self, *, hours: float = 24.0, steps: int = 48) -> dict[str, Any]:
        """The platform figures per step of the last `hours`: in total and per visible team."""
        return self._call("GET", "/v1/metrics/series", params={"hours": hours, "steps": steps})  # type: ignore[no-any-return]

    def whoami(self) -> dict[str, Any]:
        return self._call("GET", "/v1/whoami")  # type: ignore[no-any-return]

    def create_token(
        self, team: str, role: str = "member", *, description: str = "", expires_at: datetime | None = None
    ) -> dict[str, Any]:
        """Mint a token of `team` (a team admin's call, up to their role): `{"id", "team", "role",
        "expires_at", "token"}`, the secret shown this once. A POST: tried again only where the API did
        not act (no connection, 429, 503), so a retry never mints a second token."""
        body: dict[str, Any] = {"team": team, "role": role, "description": description}
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat()
        return self._call("POST", "/v1/tokens", json=body)  # type: ignore[no-any-return]

    def put_secret(self, team: str, name: str, value: str) -> dict[str, Any]:
        """Store a secret of `team` (a team admin's or platform admin's call); the value is never shown."""
        path = f"/v1/teams/{quote(team, safe='')}/secrets/{quote(name, safe='')}"
        return self._call("PUT", path, json={"value": value})  # type: ignore[no-any-return]

    def events(self, **query: Unpack[EventsQuery]) -> dict[str, Any]:
        """One page of the event log (EventsQuery says which): `{"events": [...], "cursor": N}`; pass
        `cursor` as the next `after` to miss and repeat nothing."""
        return self._call("GET", "/v1/events", **_events_request(query))  # type: ignore[no-any-return]


class EventsQuery(TypedDict, total=False):
    """A page of the event log: of one job (`job_id`, default every visible job's), after cursor
    `after` (default: from now), oldest first, at most `limit` (500) events; with `wait_s` (0), an
    empty page is held up to that long for new events (a long poll)."""

    job_id: str | None
    after: int | None
    wait_s: float
    limit: int


def _events_request(query: EventsQuery) -> dict[str, Any]:
    """The GET's params and timeout: a long poll's wait plus the usual 30 s."""
    wait_s = query.get("wait_s", 0.0)
    params: dict[str, Any] = {"wait": wait_s, "limit": query.get("limit", 500)}
    if query.get("job_id") is not None:
        params["job"] = query["job_id"]
    if query.get("after") is not None:
        params["after"] = query["after"]
    return {"params": params, "timeout": wait_s + 30.0}


class AsyncGpuyardClient(_Connection[httpx.AsyncClient]):
    """The asyncio twin of the reads a follower needs (Airflow's triggerer): jobs, cancel, events.
    It rides out an outage as GpuyardClient does."""

    _transport = httpx.AsyncClient

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        async def once() -> httpx.Response:
            return _raise_if_away(await self._http.request(method, path, **kwargs))

        retrying = tenacity.AsyncRetrying(**self.policy.kwargs(method, path, kwargs.get("headers")))
        try:
            return _answer(await retrying(once))
        except Away as error:  # not worth retrying: the answer it is
            raise _unwrap(error) from None

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    async def events(self, **query: Unpack[EventsQuery]) -> dict[str, Any]:
        """See GpuyardClient.events."""
        return await self._call("GET", "/v1/events", **_events_request(query))  # type: ignore[no-any-return]
