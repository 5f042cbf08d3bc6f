"""/v1/queue (why each job waits, paged and filtered on the server) and /v1/metrics/series."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gpuyard.api.context import Refreshed
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.platform_metrics import AttemptRecord, JobRecord, summarize
from gpuyard.platform_series import series
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings import Settings
from gpuyard.store import jobs as job_store
from gpuyard.store import leadership
from gpuyard.store import teams as team_store
from gpuyard.store import waits as wait_store
from gpuyard.store.leadership import NotLeading
from gpuyard.store.tables import jobs
from servers import wait_until
from sqlalchemy import Engine, update

from .conftest import EXAMPLE_SPEC, bearer
from .test_scheduler_service import RecordingLauncher


def _submit(api: TestClient, token: str, team: str, name: str, priority: str = "normal") -> str:
    spec = EXAMPLE_SPEC | {"team": team, "name": name, "priority": priority}
    response = api.post("/v1/jobs", json=spec, headers=bearer(token))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_queue_says_why_each_job_waits_as_the_scheduler_recorded_it_scoped_to_the_caller(
    api: TestClient, engine: Engine, settings: Settings, make_token: Callable[..., str]
) -> None:
    a, b, admin = make_token("a"), make_token("b"), make_token("ops", "platform-admin")
    first_a = _submit(api, a, "a", "a-1", "high")
    second_a = _submit(api, a, "a", "a-2")
    third_a = _submit(api, a, "a", "a-3")
    b_jobs = [_submit(api, b, "b", f"b-{i}") for i in range(3)]
    backoff = b_jobs[2]
    with engine.begin() as conn:  # team b may no longer hold a GPU (and has no cohort to borrow from)
        team_store.set_quota(conn, "b", TeamQuota(gpu_quota=0), datetime.now(UTC))
        conn.execute(
            update(jobs).where(jobs.c.id == backoff).values(not_before=datetime.now(UTC) + timedelta(hours=1))
        )

    def everything() -> dict[str, Any]:
        api.app.state.context.queue_view.clear()  # type: ignore[attr-defined]  # no cached reading
        return dict(api.get("/v1/queue", headers=bearer(admin)).json())

    before = everything()  # no pass has run: the API computes no reasons of its own
    assert {item["reason"] for item in before["items"]} == {"unseen", "backoff"}

    # One pass on the two CPU slots: a-1 (high) and a-2 are placed and leave the queue.
    scheduler = SchedulerService(engine, RecordingLauncher(), settings.fleet(), api_url=lambda: "http://api")
    scheduler.schedule()
    queue = everything()
    by_id = {item["id"]: item for item in queue["items"]}
    assert first_a not in by_id and second_a not in by_id
    assert queue["total"] == 4 and queue["policy"] == "gpuyard"
    assert queue["items"][0]["id"] == third_a  # team a's priority ahead of b's, then age
    assert by_id[third_a]["reason"] == "no-room" and by_id[third_a]["reason_since"] is not None
    assert [by_id[j]["reason"] for j in b_jobs[:2]] == ["quota", "quota"]
    assert by_id[backoff]["reason"] == "backoff" and by_id[backoff]["reason_since"] is None
    assert "retry backoff until" in by_id[backoff]["reason_text"]
    teams = {t["name"]: t for t in queue["teams"]}
    assert (teams["b"]["gpu_quota"], teams["b"]["waiting_jobs"]) == (0, 3)
    assert (teams["a"]["used_gpus"], teams["a"]["waiting_jobs"]) == (2, 1)

    # A second pass with nothing changed writes nothing: the reasons keep their time.
    scheduler.schedule()
    assert everything()["items"][0]["reason_since"] == by_id[third_a]["reason_since"]

    mine = api.get("/v1/queue", headers=bearer(a)).json()
    assert {item["team"] for item in mine["items"]} == {"a"} and mine["total"] == 1
    assert [t["name"] for t in mine["teams"]] == ["a"]
    assert api.get("/v1/queue", params={"team": "b"}, headers=bearer(a)).json()["total"] == 0

    only_quota = api.get("/v1/queue", params={"reason": "quota"}, headers=bearer(admin)).json()
    assert only_quota["total"] == queue["reasons"]["quota"] == 2
    assert {item["reason"] for item in only_quota["items"]} == {"quota"}
    page = api.get("/v1/queue", params={"offset": 1, "limit": 2}, headers=bearer(admin)).json()
    assert [i["id"] for i in page["items"]] == [i["id"] for i in queue["items"][1:3]]
    one = api.get("/v1/queue", params={"job": backoff}, headers=bearer(admin)).json()
    assert [i["id"] for i in one["items"]] == [backoff] and one["total"] == 1
    assert api.get("/v1/queue", params={"job": backoff}, headers=bearer(a)).json()["items"] == []  # b's job
    bad = api.get("/v1/queue", params={"reason": "bored"}, headers=bearer(admin))
    assert bad.status_code == 422 and "reason" in bad.json()["errors"][0]["path"]


def test_a_replica_that_lost_the_lead_records_no_reasons(
    engine: Engine, settings: Settings, make_token: Callable[..., str]
) -> None:
    make_token("a")  # team a exists
    job, _ = job_store.submit(
        engine,
        parse_spec(EXAMPLE_SPEC),
        idempotency_key=None,
        created_by="t",
        at=datetime.now(UTC),
    )
    lead = leadership.hold(engine, "scheduler", "old", now=datetime.now(UTC), ttl_s=0.0)
    assert lead is not None
    scheduler = SchedulerService(engine, RecordingLauncher(), settings.fleet(), api_url=lambda: "http://api")
    scheduler.lead = lead  # a lead that has already passed (no lease time)
    with pytest.raises(NotLeading):
        scheduler.schedule()
    with engine.connect() as conn:
        assert wait_store.read(conn) == {}
    scheduler.lead = None
    scheduler.schedule()
    with engine.connect() as conn:
        assert wait_store.read(conn)[job.id].reason.code == "starting"  # placed by this pass


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
        AttemptRecord(
            "j1", "a", 1, "PREEMPTED", (("n1", 2),), t0, t0 + hour / 2, t0 + 2 * hour, 1800.0, False
        ),
        # its resume in hour 3, which ran to the end: a 10-minute restore, 5 minutes of stalls, a new step
        AttemptRecord(
            "j1",
            "a",
            2,
            "SUCCEEDED",
            (("n1", 2),),
            t0 + 2 * hour,
            t0 + 2 * hour,
            t0 + 3 * hour,
            0.0,
            True,
            restore_s=600.0,
            checkpoint_stall_s=300.0,
            new_step_at=t0 + 2 * hour + hour / 6,
        ),
    ]
    job_list = [JobRecord("j1", "a", "SUCCEEDED", t0 - hour / 4, t0)]
    points = series(attempts, job_list, {"n1": 3.0}, 4, 12.0, t0, t0 + 4 * hour, 4)
    assert [p.utilization for p in points] == [0.5, 0.5, 0.5, 0.0]
    assert points[0].goodput == 0.5  # ran 30 of the 60 leased minutes
    assert points[1].goodput == 0.5  # ran the whole hour, but lost its last 30 minutes
    assert points[1].lost_gpu_hours == 1.0 and points[0].lost_gpu_hours == 0.0
    assert points[2].goodput == pytest.approx(45 / 60)  # the restore and the stalls are not useful
    assert points[0].queue_wait_p50_s == 900.0
    assert points[2].resume_success_share == 1.0 and points[0].resume_success_share is None
    assert points[2].jobs_finished == 1 and points[2].cost_per_job == 18.0  # 6 GPU-hours at 3.0
    assert points[3].idle_cost == 12.0 and points[0].idle_cost == 6.0
    assert series(attempts, job_list, {}, 4, 0.0, t0, t0 + hour, 1, teams={"b"})[0].leased_gpu_hours == 0.0
    # Hour by hour, the figures add up to the summary's, by the same accounting.
    whole = summarize(attempts, job_list, {}, {"n1": 3.0}, t0 + 4 * hour, t0)
    assert sum(p.leased_gpu_hours for p in points) == pytest.approx(whole.leased_gpu_hours)
    assert sum((p.goodput or 0) * p.leased_gpu_hours for p in points) == pytest.approx(whole.useful_gpu_hours)
    assert sum(p.lost_gpu_hours for p in points) == pytest.approx(whole.lost_gpu_hours)


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
