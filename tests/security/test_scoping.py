"""Every response is scoped to the caller's team: no fencing tokens, no other team's leases or figures."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from control.conftest import EXAMPLE_SPEC, bearer
from control.test_scheduler_service import FLEET, Clock, RecordingLauncher, spec, submit
from fastapi.testclient import TestClient
from gpuyard.api import routes_fleet
from gpuyard.api.app import create_app
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import AttemptState
from gpuyard.scheduler.preemption import RULES
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings import Settings
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from sqlalchemy import Engine

from training import exit_codes


def keys(document: Any) -> Iterator[str]:
    if isinstance(document, dict):
        for key, value in document.items():
            yield key
            yield from keys(value)
    elif isinstance(document, list):
        for item in document:
            yield from keys(item)


def placed(engine: Engine, team: str, gpus: tuple[int, ...], *, at: Any = None) -> tuple[str, str]:
    """A job of `team` with an attempt holding `gpus` of the local node: (job id, attempt id)."""
    with engine.begin() as conn:
        team_store.set_quota(conn, team, TeamQuota(gpu_quota=2, max_gpus_per_job=2), utcnow())
    spec = parse_spec({**EXAMPLE_SPEC, "team": team, "resources": {"gpus": len(gpus), "gpu_types": ["cpu"]}})
    job, _ = job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=at or utcnow())
    placement = Placement("local", "local", "local", (NodeSlice("local", gpus),))
    (attempt,) = reserve_batch(
        engine, [Reservation(job.id, placement, False)], at=at or utcnow(), lease_ttl_s=24 * 3600
    )
    assert attempt is not None
    return job.id, attempt.id


def test_a_job_shows_no_fencing_token_to_anyone(
    api: TestClient, make_token: Callable[..., str], engine: Engine
) -> None:
    job_id, attempt_id = placed(engine, "a", (0,))
    for token in (make_token("a"), make_token("platform", "platform-admin")):
        shown = api.get(f"/v1/jobs/{job_id}", headers=bearer(token)).json()
        assert shown["attempts"][0]["id"] == attempt_id
        assert "fencing_token" not in set(keys(shown)), shown
        listed = api.get("/v1/jobs", headers=bearer(token)).json()
        assert "fencing_token" not in set(keys(listed))
    spec = api.get("/openapi.json").json()
    assert "fencing_token" not in spec["components"]["schemas"]["AttemptOut"]["properties"]


def test_the_fleet_shows_a_member_only_its_own_teams_leases(
    api: TestClient, make_token: Callable[..., str], engine: Engine
) -> None:
    placed(engine, "a", (0,))
    placed(engine, "b", (1,))
    member_a = api.get("/v1/fleet", headers=bearer(make_token("a"))).json()
    admin = api.get("/v1/fleet", headers=bearer(make_token("platform", "platform-admin"))).json()
    assert [(n["leased_gpus"], n["free_gpus"]) for n in member_a] == [([0], 0)]
    assert [(n["leased_gpus"], n["free_gpus"]) for n in admin] == [([0, 1], 0)]


def test_the_metrics_summary_of_a_member_counts_only_its_team(
    api: TestClient, make_token: Callable[..., str], engine: Engine
) -> None:
    two_hours_ago = utcnow() - timedelta(hours=2)
    for team, gpus in (("a", (0,)), ("b", (0, 1))):
        _, attempt_id = placed(engine, team, gpus, at=two_hours_ago)
        with engine.begin() as conn:
            attempt_store.finish(
                conn,
                attempt_id,
                AttemptState.SUCCEEDED,
                at=two_hours_ago + timedelta(hours=1),
                exit_code=exit_codes.SUCCESS,
            )
    member, admin = make_token("a"), make_token("platform", "platform-admin")
    mine = api.get("/v1/metrics/summary", headers=bearer(member)).json()
    everyone = api.get("/v1/metrics/summary", headers=bearer(admin)).json()
    assert mine["leased_gpu_hours"] == pytest.approx(1.0)
    assert everyone["leased_gpu_hours"] == pytest.approx(3.0)
    assert set(mine["fair_share_attainment"]) == {"a"}
    assert set(everyone["fair_share_attainment"]) == {"a", "b"}
    # Team a's attainment is the same figure for both callers: a share among all teams.
    assert mine["fair_share_attainment"]["a"] == pytest.approx(everyone["fair_share_attainment"]["a"])


def test_prometheus_metrics_carry_no_team_and_are_computed_at_most_every_30_seconds(
    api: TestClient, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(make_token("a")))
    computed: list[float] = []
    real = routes_fleet.platform_summary

    def counting(*args: Any, **kwargs: Any) -> Any:
        computed.append(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(routes_fleet, "platform_summary", counting)
    scrapes = [api.get("/metrics").text for _ in range(5)]
    assert len(computed) == 1  # five scrapes, one summary
    assert "\ngpuyard_jobs_submitted_total " in scrapes[0]
    assert 'team="' not in scrapes[0] and "fair_share" not in scrapes[0]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_preempted_job_s_team_is_told_why_but_not_for_whose_job(
    settings: Settings, engine: Engine, make_token: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Team b's high-priority job takes the GPUs of team a's: a's member reads the reason (priority)
    in its job's events, never b's job id or team; the scheduler's log, the platform's, names it."""
    clock, launcher = Clock(), RecordingLauncher()
    with engine.begin() as conn:
        for team, quota in (("a", 16), ("b", 8)):
            team_store.set_quota(conn, team, TeamQuota(max_gpus_per_job=16, gpu_quota=quota), clock())
    service = SchedulerService(engine, launcher, FLEET, api_url=lambda: "http://api", clock=clock)
    low = [submit(engine, clock, spec(name=f"low{i}", priority="low", preemptible=True)) for i in range(4)]
    service.step()
    assert len(launcher.launched) == 4  # team a fills the fleet
    urgent = submit(engine, clock, spec(name="urgent", priority="high", team="b"))
    with caplog.at_level(logging.INFO, logger="gpuyard.scheduler.service"):
        service.step()
    assert any(f"for job {urgent}:" in record.getMessage() for record in caplog.records), caplog.text
    ((victim_id, _),) = launcher.cancelled
    victim = launcher.launched[victim_id].job_id
    assert victim in low
    member = make_token("a")
    with TestClient(create_app(settings, engine, fleet=FLEET, clock=clock)) as api:
        shown = api.get(f"/v1/jobs/{victim}", headers=bearer(member))
        events = api.get("/v1/events", params={"job": victim, "after": 0}, headers=bearer(member))
    assert shown.status_code == 200 and events.status_code == 200
    (why,) = [e["data"]["why"] for e in shown.json()["events"] if e["type"] == "attempt.stop_requested"]
    assert why == "priority: a job of a higher priority class needs its GPUs"
    assert why in events.text
    for text in (shown.text, events.text):
        assert urgent not in text and "team b" not in text and '"b"' not in text


def test_only_a_rule_within_one_team_names_the_job_that_makes_room() -> None:
    """The victim's team reads every rule's reason: a rule that may take another team's GPUs names
    neither that job nor its team (the cycle formats each with the claiming job's id)."""
    for rule in RULES.values():
        text = rule.reason.format(id="job-zz")
        assert ("job-zz" in text) == (rule.name == "priority within team") and "{" not in text, rule.name
