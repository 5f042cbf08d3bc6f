"""/v1/queue (why each job waits, paged and filtered on the server) and /v1/metrics/series."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from gpuyard.api.context import Refreshed
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.platform_metrics import AttemptRecord, JobRecord
from gpuyard.platform_series import series
from gpuyard.store import teams as team_store
from gpuyard.store.tables import jobs
from servers import wait_until
from sqlalchemy import Engine, update

from .conftest import EXAMPLE_SPEC, bearer


def _submit(api: TestClient, token: str, team: str, name: str, priority: str = "normal") -> str:
    spec = EXAMPLE_SPEC | {"team": team, "name": name, "priority": priority}
    response = api.post("/v1/jobs", json=spec, headers=bearer(token))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_queue_says_why_each_job_waits_scoped_to_the_caller(
    api: TestClient, engine: Engine, make_token: Callable[..., str]
) -> None:
    a, b, admin = make_token("a"), make_token("b"), make_token("ops", "platform-admin")
    first_a = _submit(api, a, "a", "a-1", "high")
    second_a = _submit(api, a, "a", "a-2")
    b_jobs = [_submit(api, b, "b", f"b-{i}") for i in range(3)]
    backoff = b_jobs[2]
    with engine.begin() as conn:  # team b may no longer hold a GPU (and has no cohort to borrow from)
        team_store.set_quota(conn, "b", TeamQuota(gpu_quota=0), datetime.now(UTC))
        conn.execute(
            update(jobs).where(jobs.c.id == backoff).values(not_before=datetime.now(UTC) + timedelta(hours=1))
        )

    everything = api.get("/v1/queue", headers=bearer(admin)).json()
    by_id = {item["id"]: item for item in everything["items"]}
    assert everything["total"] == 5 and everything["policy"] == "gpuyard"
    assert everything["items"][0]["id"] == first_a  # high priority first
    assert by_id[first_a]["priority"] == "high"
    assert by_id[backoff]["reason"] == "backoff"
    assert "retry backoff until" in by_id[backoff]["reason_text"]
    # Two CPU slots: both of team a's jobs fit now; team b's are over its quota.
    assert [by_id[j]["reason"] for j in (first_a, second_a, *b_jobs[:2])] == [
        "starting",
        "starting",
        "quota",
        "quota",
    ]
    assert {t["name"]: (t["gpu_quota"], t["waiting_jobs"]) for t in everything["teams"]}["b"] == (0, 3)

    mine = api.get("/v1/queue", headers=bearer(a)).json()
    assert {item["team"] for item in mine["items"]} == {"a"} and mine["total"] == 2
    assert [t["name"] for t in mine["teams"]] == ["a"]
    assert api.get("/v1/queue", params={"team": "b"}, headers=bearer(a)).json()["total"] == 0

    only_quota = api.get("/v1/queue", params={"reason": "quota"}, headers=bearer(admin)).json()
    assert only_quota["total"] == everything["reasons"]["quota"]
    assert {item["reason"] for item in only_quota["items"]} == {"quota"}
    page = api.get("/v1/queue", params={"offset": 1, "limit": 2}, headers=bearer(admin)).json()
    assert [i["id"] for i in page["items"]] == [i["id"] for i in everything["items"][1:3]]
    one = api.get("/v1/queue", params={"job": backoff}, headers=bearer(admin)).json()
    assert [i["id"] for i in one["items"]] == [backoff] and one["total"] == 1
    assert api.get("/v1/queue", params={"job": backoff}, headers=bearer(a)).json()["items"] == []  # b's job
    bad = api.get("/v1/queue", params={"reason": "bored"}, headers=bearer(admin))
    assert bad.status_code == 422 and "reason" in bad.json()["errors"][0]["path"]


def test_series_cuts_the_window_into_steps_scoped_to_the_caller(
    api: TestClient, make_token: Callable[..., str]
) -> None:
    a, admin = make_token("a"), make_token("ops", "platform-admin")
    _submit(api, a, "a", "a-1")
    mine = api.get("/v1/metrics/series", params={"hours": 2, "steps": 4}, headers=bearer(a)).json()
    assert list(mine["teams"]) == ["a"] and len(mine["total"]) == 4
    assert all(point["idle_cost"] is None for point in mine["total"])  # idle GPUs belong to no team
    everything = api.get("/v1/metrics/series", params={"hours": 2, "steps": 4}, headers=bearer(admin)).json()
    assert set(everything["teams"]) >= {"a", "ops"}
    last = everything["total"][-1]
    assert last["utilization"] == 0.0 and last["idle_cost"] == 0.0  # nothing ran; local slots are free
    assert api.get("/v1/metrics/series", params={"steps": 0}, headers=bearer(a)).status_code == 422
    tiny = api.get("/v1/metrics/series", params={"hours": 5e-324}, headers=bearer(a))  # the fuzzer's 500
    assert tiny.status_code == 422 and tiny.json()["errors"][0]["path"] == "query.hours"


def test_series_figures_per_step() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    hour = timedelta(hours=1)
    attempts = [
        # 2 GPUs leased for the first two hours, started after 30 min, 0.5 h of progress lost at its end
        AttemptRecord("j1", "a", 1, "PREEMPTED", 2, ("n1",), t0, t0 + hour / 2, t0 + 2 * hour, 1800.0, False),
        # its resume in hour 3, which ran to the end
        AttemptRecord(
            "j1", "a", 2, "SUCCEEDED", 2, ("n1",), t0 + 2 * hour, t0 + 2 * hour, t0 + 3 * hour, 0.0, True
        ),
    ]
    job_list = [JobRecord("j1", "a", "SUCCEEDED", t0 - hour / 4, t0)]
    points = series(attempts, job_list, {"n1": 3.0}, 4, 12.0, t0, t0 + 4 * hour, 4)
    assert [p.utilization for p in points] == [0.5, 0.5, 0.5, 0.0]
    assert points[0].goodput == 0.5  # ran 30 of the 60 leased minutes
    assert points[1].goodput == 0.5  # ran the whole hour, but lost 30 minutes of it at the end
    assert points[1].lost_gpu_hours == 1.0
    assert points[0].queue_wait_p50_s == 900.0
    assert points[2].resume_success_share == 1.0 and points[0].resume_success_share is None
    assert points[2].jobs_finished == 1 and points[2].cost_per_job == 18.0  # 6 GPU-hours at 3.0
    assert points[3].idle_cost == 12.0 and points[0].idle_cost == 6.0
    assert series(attempts, job_list, {}, 4, 0.0, t0, t0 + hour, 1, teams={"b"})[0].leased_gpu_hours == 0.0


def test_refreshed_serves_the_value_it_has_while_one_reload_runs() -> None:
    clock = [0.0]
    release, reloaded = threading.Event(), threading.Event()
    loads: list[int] = []

    def load() -> int:
        loads.append(len(loads))
        if len(loads) > 1:
            release.wait(10)
            reloaded.set()
        return len(loads)

    value = Refreshed[int](ttl_s=5.0, timer=lambda: clock[0])
    assert value.get(load) == 1 and value.get(load) == 1 and loads == [0]  # within the period: no load
    clock[0] = 6.0
    assert [value.get(load) for _ in range(3)] == [1, 1, 1]  # stale at once, and one reload only
    release.set()
    assert reloaded.wait(10)
    wait_until(lambda: value.get(load) == 2, 10, what="the reloaded value")
    assert len(loads) == 2
