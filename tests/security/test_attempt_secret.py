"""A worker proves its attempt with the attempt's secret, not with its id and fencing token (a counter,
guessable): a heartbeat without the secret, with another, or for an ended attempt is refused exactly
like one for an unknown attempt, and changes nothing; no response or event ever shows the secret."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from control.conftest import EXAMPLE_SPEC, bearer
from fastapi.testclient import TestClient
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.model import Attempt
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import AttemptState
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.tables import attempts, events, jobs
from sqlalchemy import Engine, select

CHECKPOINT = {"url": "file:///tmp/gpuyard-ckpt/flights/step-10", "step": 10}


def reserved(engine: Engine, gpu: int) -> Attempt:
    """A job of team a with an attempt on GPU `gpu` of the local node, as the scheduler reserves one."""
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=2, max_gpus_per_job=1), utcnow())
    spec = parse_spec({**EXAMPLE_SPEC, "resources": {"gpus": 1, "gpu_types": ["cpu"]}})
    job, _ = job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=utcnow())
    placement = Placement("local", "local", "local", (NodeSlice("local", (gpu,)),))
    (attempt,) = reserve_batch(engine, [Reservation(job.id, placement, False)], at=utcnow(), lease_ttl_s=60)
    assert attempt is not None and attempt.attempt_secret
    return attempt


def beat(api: TestClient, attempt_id: str, token: int, secret: str | bytes | None) -> httpx.Response:
    headers: dict[str, Any] = {}
    if isinstance(secret, bytes):  # a header's raw bytes: what no str header can carry
        headers["Authorization"] = b"Bearer " + secret
    elif secret is not None:
        headers = bearer(secret)
    body = {"fencing_token": token, "step": 10, "checkpoint": CHECKPOINT}
    return api.post(f"/v1/attempts/{attempt_id}/heartbeat", json=body, headers=headers)


def refusal(response: httpx.Response) -> dict[str, Any]:
    """What a refusal says, less its `instance` (the path, which names the attempt asked about)."""
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"] == "application/problem+json"
    return {k: v for k, v in response.json().items() if k != "instance"}


def rows(engine: Engine, attempt: Attempt) -> tuple[Any, ...]:
    """Everything a heartbeat could change: the attempt's row, its job's, and the event log's length."""
    with engine.connect() as conn:
        return (
            conn.execute(select(attempts).where(attempts.c.id == attempt.id)).one()._asdict(),
            conn.execute(select(jobs).where(jobs.c.id == attempt.job_id)).one()._asdict(),
            len(conn.execute(select(events.c.seq)).all()),
        )


def test_a_heartbeat_without_its_attempts_secret_is_refused_like_an_unknown_attempt_and_changes_nothing(
    api: TestClient, engine: Engine, make_token: Callable[..., str]
) -> None:
    attempt, other = reserved(engine, 0), reserved(engine, 1)
    assert attempt.attempt_secret != other.attempt_secret
    secret, token = attempt.attempt_secret or "", attempt.fencing_token
    unknown = refusal(beat(api, f"{attempt.job_id}-a1-0000000000000000", token, secret))
    before = rows(engine, attempt)
    offers = {
        "none": None,
        "empty": "",
        "another attempt's": other.attempt_secret,
        "a team token": make_token("a"),
        "one character short": secret[:-1],
        "one character changed": secret[:-1] + ("A" if secret[-1] != "A" else "B"),
        "not ASCII": "é".encode("latin-1") + secret[1:].encode(),
    }
    for what, offer in offers.items():
        assert refusal(beat(api, attempt.id, token, offer)) == unknown, what
    assert rows(engine, attempt) == before  # no lease renewed, no step, no checkpoint, no event
    answer = beat(api, attempt.id, token, secret)
    assert answer.status_code == 200 and answer.json()["action"] == "continue", answer.text
    with engine.connect() as conn:
        found = attempt_store.attempt(conn, attempt.id)
    assert found is not None and (found.state, found.step, found.checkpoint_step) == (
        AttemptState.RUNNING,
        10,
        10,
    )
    # The fencing token still orders writes: with the attempt's secret, another token is stale.
    stale = beat(api, attempt.id, token - 1, secret)
    assert stale.status_code == 409 and stale.json()["type"] == "/problems/stale-token"


def test_an_ended_attempts_secret_is_refused(api: TestClient, engine: Engine) -> None:
    attempt = reserved(engine, 0)
    secret = attempt.attempt_secret or ""
    assert beat(api, attempt.id, attempt.fencing_token, secret).status_code == 200
    with engine.begin() as conn:
        assert attempt_store.finish(conn, attempt.id, AttemptState.LOST, at=utcnow(), reason="node gone")
    with engine.connect() as conn:
        ended = attempt_store.attempt(conn, attempt.id)
    assert ended is not None and ended.attempt_secret is None  # it died with the attempt
    before = rows(engine, attempt)
    unknown = refusal(beat(api, f"{attempt.job_id}-a9-0000000000000000", attempt.fencing_token, secret))
    assert refusal(beat(api, attempt.id, attempt.fencing_token, secret)) == unknown
    assert rows(engine, attempt) == before


def test_no_response_or_event_shows_an_attempts_secret(
    api: TestClient, engine: Engine, make_token: Callable[..., str]
) -> None:
    attempt = reserved(engine, 0)
    secret = attempt.attempt_secret or ""
    member, admin = bearer(make_token("a")), bearer(make_token("platform", "platform-admin"))
    answers = [beat(api, attempt.id, attempt.fencing_token, secret)]  # a checkpoint: an event
    answers.append(api.post(f"/v1/attempts/{attempt.id}/preempt", headers=admin))
    assert [a.status_code for a in answers] == [200, 202], [a.text for a in answers]
    for caller in (member, admin):
        for path in (
            f"/v1/jobs/{attempt.job_id}",
            "/v1/jobs",
            "/v1/events?after=0",
            f"/v1/events?after=0&job={attempt.job_id}",
            "/v1/queue",
            "/v1/fleet",
        ):
            answers.append(api.get(path, headers=caller))
    detail = answers[2].json()
    assert detail["attempts"][0]["id"] == attempt.id and len(detail["events"]) >= 4
    for answer in answers:
        assert answer.status_code in (200, 202), answer.text
        assert secret not in answer.text and "attempt_secret" not in answer.text, answer.request.url
    with engine.connect() as conn:
        logged = conn.execute(select(events)).all()
    assert logged and all(secret not in str(event) for event in logged)
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert "attempt_secret" not in str(schemas)
    assert secret not in repr(attempt)  # nor a log line of the attempt
