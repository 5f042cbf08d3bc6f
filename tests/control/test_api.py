"""The HTTP API against both stores: submit, idempotency, visibility, quotas, errors as problems."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient
from gpuyard.api.schemas import JobOut
from gpuyard.clock import utcnow
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.store import jobs as job_store
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.tables import events, jobs
from sqlalchemy import Engine, func, select

from .conftest import EXAMPLE_SPEC, bearer


def test_submit_stores_the_job_and_its_event(
    api: TestClient, make_token: Callable[..., str], engine: Engine
) -> None:
    token = make_token("a")
    response = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token, **{"Idempotency-Key": "k1"}))
    assert response.status_code == 201, response.text
    job = response.json()
    assert (
        job["state"] == "PENDING" and job["team"] == "a" and job["spec"]["checkpoint"]["interval"] == "auto"
    )
    with engine.connect() as conn:
        stored = job_store.get(conn, job["id"])
        written = conn.execute(select(events).where(events.c.job_id == job["id"])).all()
    # Each store has its own submit path (store/submitter.py): both write exactly these rows.
    assert stored is not None and JobOut.of(stored).model_dump(mode="json") == job
    assert [(e.type, e.data, e.at, e.published_at) for e in written] == [
        ("job.submitted", {"team": "a", "gpus": 1, "priority": "normal"}, stored.created_at, None)
    ]


def test_idempotency_key_replays_and_conflicts(api: TestClient, make_token: Callable[..., str]) -> None:
    headers = bearer(make_token("a"), **{"Idempotency-Key": "same"})
    first = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=headers)
    again = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = api.post("/v1/jobs", json={**EXAMPLE_SPEC, "name": "other"}, headers=headers)
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    assert first.json()["id"] in other.json()["detail"]
    too_long = api.post(
        "/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(make_token("a"), **{"Idempotency-Key": "k" * 256})
    )
    assert too_long.status_code == 422
    assert too_long.json()["errors"] == [
        {"path": "header.idempotency-key", "rule": "must be 1 to 255 characters long"}
    ]


def test_invalid_spec_is_a_problem_with_field_paths(
    api: TestClient, make_token: Callable[..., str], engine: Engine
) -> None:
    token = make_token("a")
    bad = {**EXAMPLE_SPEC, "resources": {"gpus": 9, "gpu_types": ["cpu"], "nodes": 1}, "colour": "red"}
    response = api.post("/v1/jobs", json=bad, headers=bearer(token))
    assert response.status_code == 422
    assert {"path": "colour", "rule": "Extra inputs are not permitted"} in response.json()["errors"]
    nul = api.post("/v1/jobs", json={**EXAMPLE_SPEC, "command": ["echo", "a\u0000b"]}, headers=bearer(token))
    assert nul.status_code == 422
    assert [e["path"] for e in nul.json()["errors"]] == ["command.1"] and "NUL" in nul.text
    infeasible = api.post(
        "/v1/jobs",
        json={key: value for key, value in bad.items() if key != "colour"},
        headers=bearer(token),
    )
    assert infeasible.status_code == 422
    paths = {e["path"] for e in infeasible.json()["errors"]}
    assert paths == {"resources.gpus"}
    assert "team a may use at most 8" in infeasible.text and "largest node" in infeasible.text
    again = api.post(  # the fleet's answer is memoized: the same answer, the same problem
        "/v1/jobs", json={key: value for key, value in bad.items() if key != "colour"}, headers=bearer(token)
    )
    assert again.status_code == 422 and again.json()["errors"] == infeasible.json()["errors"]
    not_json = api.post(
        "/v1/jobs", content=b"{nope", headers=bearer(token, **{"content-type": "application/json"})
    )
    assert not_json.status_code == 422
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar() == 0


def test_tokens_and_team_visibility(api: TestClient, make_token: Callable[..., str]) -> None:
    a, b = make_token("a"), make_token("b")
    assert api.get("/v1/jobs").status_code == 401
    assert api.get("/v1/jobs", headers=bearer("gy_0000_nope")).status_code == 401
    job = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(a)).json()
    assert api.get(f"/v1/jobs/{job['id']}", headers=bearer(b)).status_code == 404
    assert api.post(f"/v1/jobs/{job['id']}/cancel", headers=bearer(b)).status_code == 404
    assert api.get("/v1/jobs", headers=bearer(b)).json()["items"] == []
    assert api.get("/v1/jobs?team=a", headers=bearer(b)).json()["items"] == []
    assert api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(b)).status_code == 403
    assert api.get(f"/v1/jobs/{job['id']}", headers=bearer(a)).json()["events"][0]["type"] == "job.submitted"
    admin = make_token("platform", "platform-admin")
    assert api.get(f"/v1/jobs/{job['id']}", headers=bearer(admin)).status_code == 200


def test_cancel_pending_then_conflict(api: TestClient, make_token: Callable[..., str]) -> None:
    token = make_token("a")
    job = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(token)).json()
    cancelled = api.post(f"/v1/jobs/{job['id']}/cancel", headers=bearer(token))
    assert cancelled.json()["state"] == "CANCELLED"
    again = api.post(f"/v1/jobs/{job['id']}/cancel", headers=bearer(token))
    assert again.status_code == 409 and again.json()["state"] == "CANCELLED"


def test_list_filters_and_cursor_pagination(api: TestClient, make_token: Callable[..., str]) -> None:
    token = make_token("a")
    ids = [
        api.post("/v1/jobs", json={**EXAMPLE_SPEC, "name": f"j{i}"}, headers=bearer(token)).json()["id"]
        for i in range(7)
    ]
    api.post(f"/v1/jobs/{ids[0]}/cancel", headers=bearer(token))
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 3}
    while True:
        page = api.get("/v1/jobs", params=params, headers=bearer(token)).json()
        seen += [item["id"] for item in page["items"]]
        if not page["next_cursor"]:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == list(reversed(ids))
    cancelled = api.get("/v1/jobs", params={"state": "CANCELLED"}, headers=bearer(token)).json()["items"]
    assert [j["id"] for j in cancelled] == [ids[0]]
    bad = api.get("/v1/jobs", params={"cursor": "%%%"}, headers=bearer(token))
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "cursor"
    assert api.get("/v1/jobs", params={"state": "NAPPING"}, headers=bearer(token)).json()["errors"][0][
        "path"
    ] == ("query.state")


def test_quotas_are_data_edited_by_platform_admins(api: TestClient, make_token: Callable[..., str]) -> None:
    member, admin = make_token("a"), make_token("platform", "platform-admin")
    quota = {"max_gpus_per_job": 1, "allowed_gpu_types": ["cpu"], "gpu_quota": 2}
    assert api.put("/v1/teams/a/quota", json=quota, headers=bearer(member)).status_code == 403
    assert api.put("/v1/teams/a/quota", json=quota, headers=bearer(admin)).status_code == 200
    assert api.get("/v1/teams/a", headers=bearer(member)).json()["quota"]["max_gpus_per_job"] == 1
    assert api.get("/v1/teams/platform", headers=bearer(member)).status_code == 404
    too_big = {**EXAMPLE_SPEC, "resources": {"gpus": 2, "gpu_types": ["cpu"]}}
    refused = api.post("/v1/jobs", json=too_big, headers=bearer(member))
    assert refused.status_code == 422 and "at most 1 GPUs" in refused.text
    created = api.put("/v1/teams/new-team/quota", json=quota, headers=bearer(admin))
    assert created.status_code == 201
    bad = api.put("/v1/teams/Bad_Name/quota", json=quota, headers=bearer(admin))
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "team"
    # A quota past what any fleet (or the store's integer columns) holds is refused, field named,
    # and the quota already accepted is kept.
    huge = api.put("/v1/teams/a/quota", json={**quota, "gpu_quota": 10**26}, headers=bearer(admin))
    assert huge.status_code == 422 and "gpu_quota" in huge.text
    nul = api.put("/v1/teams/a/quota", json={**quota, "cohort": "x\u0000"}, headers=bearer(admin))
    assert nul.status_code == 422, nul.text
    assert api.get("/v1/teams/a", headers=bearer(member)).json()["quota"]["gpu_quota"] == 2


def test_token_minting_rules(api: TestClient, make_token: Callable[..., str]) -> None:
    member, team_admin = make_token("a"), make_token("a", "team-admin")
    assert api.post("/v1/tokens", json={"team": "a"}, headers=bearer(member)).status_code == 403
    minted = api.post("/v1/tokens", json={"team": "a", "role": "member"}, headers=bearer(team_admin))
    assert minted.status_code == 201
    new_token = minted.json()["token"]
    assert api.get("/v1/whoami", headers=bearer(new_token)).json()["team"] == "a"
    assert api.post("/v1/tokens", json={"team": "b"}, headers=bearer(team_admin)).status_code == 403
    escalate = api.post(
        "/v1/tokens", json={"team": "a", "role": "platform-admin"}, headers=bearer(team_admin)
    )
    assert escalate.status_code == 403
    assert api.delete(f"/v1/tokens/{minted.json()['id']}", headers=bearer(team_admin)).status_code == 204
    assert api.get("/v1/whoami", headers=bearer(new_token)).status_code == 401


def test_body_over_one_mebibyte_is_refused_before_parsing(
    api: TestClient, make_token: Callable[..., str]
) -> None:
    token = make_token("a")
    huge = b'{"name": "' + b"x" * (1 << 20) + b'"}'
    response = api.post(
        "/v1/jobs", content=huge, headers=bearer(token, **{"content-type": "application/json"})
    )
    assert response.status_code == 413 and response.json()["status"] == 413

    def chunks():  # no Content-Length: counted while streaming
        for _ in range(20):
            yield b"x" * 65536

    streamed = api.post(
        "/v1/jobs", content=chunks(), headers=bearer(token, **{"content-type": "application/json"})
    )
    assert streamed.status_code == 413


def test_health_readiness_metrics_and_openapi(api: TestClient, make_token: Callable[..., str]) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}
    api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(make_token("a")))
    text = api.get("/metrics").text
    assert 'gpuyard_jobs{state="PENDING"} 1.0' in text
    assert 'gpuyard_http_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
    spec = api.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/healthz", "/readyz"} <= set(
        spec["paths"]
    )
    assert "JobSpec" in spec["components"]["schemas"]


def test_an_elastic_job_is_stored_at_its_launch_size_and_its_workers_report_their_throughput(
    api: TestClient, make_token: Callable[..., str], engine: Engine
) -> None:
    """`gpus: {min, max}` is kept as written; the job is stored (and placed) at its min and admitted on
    its max; its workers' heartbeats report step time and batch, kept on the attempt and shown."""
    token = make_token("a")
    elastic = {**EXAMPLE_SPEC, "resources": {"gpus": {"min": 1, "max": 2}, "gpu_types": ["cpu"]}}
    response = api.post("/v1/jobs", json=elastic, headers=bearer(token))
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["resources"]["gpus"] == {"min": 1, "max": 2}
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.gpus).where(jobs.c.id == job["id"])).scalar_one() == 1
    beyond = {**EXAMPLE_SPEC, "resources": {"gpus": {"min": 1, "max": 3}, "gpu_types": ["cpu"]}}
    refused = api.post("/v1/jobs", json=beyond, headers=bearer(token))  # the local node has 2 slots
    assert refused.status_code == 422 and refused.json()["errors"][0]["path"] == "resources.gpus"

    placement = Placement("local", "local", "local", (NodeSlice("local", (0,)),))
    reservation = Reservation(job["id"], placement, False)
    (attempt,) = reserve_batch(engine, [reservation], at=utcnow(), lease_ttl_s=60)
    assert attempt is not None

    def beat(**fields: Any) -> int:
        body = {"fencing_token": attempt.fencing_token, "step": 5, **fields}
        headers = bearer(attempt.attempt_secret or "")
        return api.post(f"/v1/attempts/{attempt.id}/heartbeat", json=body, headers=headers).status_code

    throughput = {"step_s": 0.25, "local_batch": 8, "accum_steps": 4, "global_batch": 32}
    assert beat(throughput=throughput) == 200
    assert beat() == 200  # a beat without it (an older worker, a plain command) keeps the last one
    assert beat(throughput={**throughput, "local_batch": 0}) == 422
    assert beat(throughput={**throughput, "step_s": 0}) == 422
    assert beat(throughput={k: v for k, v in throughput.items() if k != "global_batch"}) == 422
    shown = api.get(f"/v1/jobs/{job['id']}", headers=bearer(token)).json()["attempts"][0]
    assert {k: shown[k] for k in throughput} == throughput
