"""gpuyard's HTTP client: what the CLI, the Airflow operator and scripts use. Never the internals.

It finds the server through an explicit URL and token, `GPUYARD_URL`/`GPUYARD_TOKEN`, or the
files an embedded instance (`gpuyard up`) writes into its home.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
SERVER_FILE = "server.json"
ADMIN_TOKEN_FILE = "admin.token"


class ApiError(Exception):
    """The server said no; `problem` is its problem-details body."""

    def __init__(self, status: int, problem: dict[str, Any]):
        self.status, self.problem = status, problem
        lines = [f"{problem.get('title', 'Error')} ({status}): {problem.get('detail', '')}"]
        lines += [f"  - {e['path']}: {e['rule']}" for e in problem.get("errors") or []]
        super().__init__("\n".join(lines))


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


def _http_options(endpoint: Endpoint, timeout_s: float) -> dict[str, Any]:
    """What both clients' httpx client is made with: the server, the bearer token, the timeout."""
    return {
        "base_url": endpoint.url,
        "headers": {"Authorization": f"Bearer {endpoint.token}"},
        "timeout": timeout_s,
    }


def _backoff_s(attempt: int) -> float:
    """How long to wait before retrying after try number `attempt` (0, 1, ...) failed."""
    return 0.5 * 2**attempt


def _retries(response: httpx.Response, attempt: int, retries: int) -> bool:
    """Is the answer worth another try? A 503 is (the server is momentarily unavailable), while tries
    are left. Retries are safe: reads are idempotent and submits carry an Idempotency-Key."""
    return response.status_code == 503 and attempt < retries


def _answer(response: httpx.Response) -> Any:
    """The body of a success (None when empty); a 4xx or 5xx is raised as ApiError."""
    if response.status_code >= 400:
        try:
            problem = response.json()
        except ValueError:
            problem = {"title": response.reason_phrase, "detail": response.text[:500]}
        raise ApiError(response.status_code, problem)
    return response.json() if response.content else None


class GpuyardClient:
    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 30.0, retries: int = 3):
        self.endpoint = endpoint
        self.retries = retries
        self._http = httpx.Client(**_http_options(endpoint, timeout_s))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GpuyardClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        # Retries are safe: reads are idempotent and submits carry an Idempotency-Key.
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
                time.sleep(_backoff_s(attempt))
                continue
            if _retries(response, attempt, self.retries):
                time.sleep(_backoff_s(attempt))
                continue
            return _answer(response)
        raise AssertionError("unreachable")

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
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
        """The workers' output, line by line; with `follow`, streamed until the attempt ends."""
        params: dict[str, Any] = {"follow": follow}
        if attempt is not None:
            params["attempt"] = attempt
        with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError(response.status_code, response.json())
            yield from response.iter_lines()

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

    def events(
        self,
        *,
        job_id: str | None = None,
        after: int | None = None,
        wait_s: float = 0.0,
        limit: int = 500,
    ) -> dict[str, Any]:
        """One page of the event log after cursor `after` (None: from now), oldest first.

        With `wait_s`, an empty page is held up to that long for new events (a long poll). Returns
        `{"events": [...], "cursor": N}`: pass `cursor` as the next `after` to miss and repeat nothing.
        """
        params = _events_params(job_id, after, wait_s, limit)
        return self._call("GET", "/v1/events", params=params, timeout=wait_s + 30.0)  # type: ignore[no-any-return]


def _events_params(job_id: str | None, after: int | None, wait_s: float, limit: int) -> dict[str, Any]:
    params: dict[str, Any] = {"wait": wait_s, "limit": limit}
    if job_id is not None:
        params["job"] = job_id
    if after is not None:
        params["after"] = after
    return params


class AsyncGpuyardClient:
    """The asyncio twin of the reads a follower needs (Airflow's triggerer): jobs, cancel, events."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 30.0, retries: int = 3):
        self.endpoint = endpoint
        self.retries = retries
        self._http = httpx.AsyncClient(**_http_options(endpoint, timeout_s))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        # The same retry rule as GpuyardClient._call: reads are idempotent, a 503 is worth a retry.
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
                await asyncio.sleep(_backoff_s(attempt))
                continue
            if _retries(response, attempt, self.retries):
                await asyncio.sleep(_backoff_s(attempt))
                continue
            return _answer(response)
        raise AssertionError("unreachable")

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    async def events(
        self,
        *,
        job_id: str | None = None,
        after: int | None = None,
        wait_s: float = 0.0,
        limit: int = 500,
    ) -> dict[str, Any]:
        """See GpuyardClient.events."""
        params = _events_params(job_id, after, wait_s, limit)
        return await self._call("GET", "/v1/events", params=params, timeout=wait_s + 30.0)  # type: ignore[no-any-return]
