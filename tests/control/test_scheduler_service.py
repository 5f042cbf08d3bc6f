"""The scheduler service against a real store: reserve, launch once, leases, heartbeats, reaping,
preemption, leader election. The launcher here only records calls (the launcher tests run real ones)."""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.bus.base import Message
from gpuyard.bus.memory import MemoryBus
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.retry import young_daly_interval_s
from gpuyard.domain.spec import JobSpec, parse_spec
from gpuyard.domain.states import AttemptState
from gpuyard.launchers.base import LaunchRequest, Outcome, WorkerReport
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings import Settings
from gpuyard.store import attempts as attempt_store
from gpuyard.store import interruptions
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine, migrate
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.tables import attempts, leases
from gpuyard.store.tables import events as events_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event, func, select
from sqlalchemy.exc import OperationalError

from training import exit_codes

from .conftest import EXAMPLE_SPEC


def two_domains(gpus_per_node: int) -> Fleet:
    """Two domains (d0, d1) of two a100 nodes each (d0n0, d0n1, d1n0, d1n1), in site east, cluster c."""
    return Fleet(
        nodes=tuple(
            Node(
                name=f"d{d}n{i}",
                site="east",
                cluster="c",
                domain=f"d{d}",
                gpu_type="a100",
                gpus=gpus_per_node,
                gpu_memory_gb=80,
            )
            for d in range(2)
            for i in range(2)
        )
    )


FLEET = two_domains(4)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class RecordingLauncher:
    """Records launches and cancels; reports what the test tells it to, until acknowledged; sees
    alive the attempts the test says."""

    def __init__(self) -> None:
        self.launched: dict[str, LaunchRequest] = {}
        self.launch_calls: list[str] = []
        self.cancelled: list[tuple[str, float]] = []
        self.pending_reports: list[WorkerReport] = []
        self.acknowledged: list[WorkerReport] = []
        self.running: set[str] = set()  # attempts whose workers the test says are alive
        self.released: list[str] = []
        self.releasable = True

    def launch(self, request: LaunchRequest) -> None:
        self.launch_calls.append(request.attempt_id)
        self.launched.setdefault(request.attempt_id, request)

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        self.cancelled.append((attempt_id, grace_s))

    def observe(self) -> list[WorkerReport]:
        return list(self.pending_reports)

    def acknowledge(self, report: WorkerReport) -> None:
        self.pending_reports.remove(report)
        self.acknowledged.append(report)

    def alive(self) -> dict[str, int]:
        return {a: self.launched[a].fencing_token for a in self.running}

    def starting(self) -> dict[str, int]:
        return {}  # its workers start at once

    def release(self, attempt_id: str) -> bool:
        self.released.append(attempt_id)
        self.running.discard(attempt_id)
        return self.releasable

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        return []

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        return iter(())


def spec(name: str = "train", gpus: int = 4, nodes: int = 1, **changes: Any) -> dict[str, Any]:
    return {
        **EXAMPLE_SPEC,
        "name": name,
        "resources": {"gpus": gpus, "nodes": nodes, "gpu_types": ["a100"]},
        **changes,
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def launcher() -> RecordingLauncher:
    return RecordingLauncher()


@pytest.fixture
def service(engine: Engine, launcher: RecordingLauncher, clock: Clock) -> SchedulerService:
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=16), clock())
    return SchedulerService(
        engine, launcher, FLEET, api_url=lambda: "http://api", clock=clock, lease_ttl_s=60
    )


def submit(engine: Engine, clock: Clock, data: dict[str, Any]) -> str:
    job, _ = job_store.submit(engine, parse_spec(data), idempotency_key=None, created_by="t", at=clock())
    return job.id


def beat(
    engine: Engine,
    request: LaunchRequest,
    clock: Clock,
    step: int,
    checkpoint: dict[str, Any] | None = None,
    **overheads: Any,
) -> attempt_store.Beat:
    """A heartbeat of the attempt's worker at `clock`'s now, reporting `checkpoint` if it has one (and
    `restore`, `checkpoint_stall_s` if given)."""
    return attempt_store.heartbeat(
        engine,
        request.attempt_id,
        request.fencing_token,
        secret=request.attempt_secret,
        step=step,
        checkpoint=checkpoint,
        at=clock(),
        lease_ttl_s=60,
        **overheads,
    )


def state(engine: Engine, job_id: str) -> str:
    with engine.connect() as conn:
        job = job_store.get(conn, job_id)
        assert job is not None
        return job.state.value


def live_attempts(engine: Engine, job_id: str) -> list[Any]:
    with engine.connect() as conn:
        return [a for a in attempt_store.live(conn) if a.job.id == job_id]


def test_a_job_is_reserved_leased_and_launched_once(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec(gpus=8, nodes=2))
    bus = MemoryBus()
    for _ in range(5):  # the same "job submitted" event delivered five times
        bus.publish([Message(1, "job.submitted", job_id)])
        service.step()
    assert len(launcher.launched) == 1 and len(launcher.launch_calls) == 1
    request = next(iter(launcher.launched.values()))
    assert request.placement.domain in ("d0", "d1") and request.placement.gpus == 8
    assert len({n for n in request.placement.nodes}) == 2
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(leases)).scalar() == 8
        assert conn.execute(select(func.count()).select_from(attempts)).scalar() == 1
    assert state(engine, job_id) == "SCHEDULED"
    launcher.pending_reports.append(WorkerReport(request.attempt_id, Outcome.RUNNING, clock()))
    service.step()
    assert state(engine, job_id) == "RUNNING"
    launcher.pending_reports.append(
        WorkerReport(request.attempt_id, Outcome.SUCCEEDED, clock(), 0, "exited 0")
    )
    service.step()
    assert state(engine, job_id) == "SUCCEEDED"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(leases)).scalar() == 0


def test_the_automatic_checkpoint_interval_is_the_gangs_and_learns_from_what_its_nodes_lost(
    engine: Engine, settings: Settings, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """A gang on two nodes is interrupted about twice as often as one node (the interval was the one
    of its least reliable node); a LOST attempt charges each of its nodes half an interruption, kept
    as it ends and read, not recomputed from past attempts, by the next heartbeat."""
    submit(engine, clock, spec(gpus=8, nodes=2))
    service.step()
    request = next(iter(launcher.launched.values()))
    nodes = sorted(s.node for s in request.placement.slices)
    prior = 720 * 3600.0  # FLEET's nodes are on demand
    with TestClient(create_app(settings, engine, fleet=FLEET, clock=clock)) as api:
        answer = api.post(
            f"/v1/attempts/{request.attempt_id}/heartbeat",
            headers={"Authorization": f"Bearer {request.attempt_secret}"},
            json={
                "fencing_token": request.fencing_token,
                "step": 10,
                "checkpoint": {"url": "file:///tmp/gpuyard-ckpt/flights/step-10", "step": 10, "cost_s": 4.0},
            },
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["checkpoint_interval_s"] == pytest.approx(young_daly_interval_s(4.0, prior / 2))
    launcher.pending_reports.append(WorkerReport(request.attempt_id, Outcome.RUNNING, clock()))
    service.step()
    clock.advance(3600)
    lost = WorkerReport(request.attempt_id, Outcome.LOST, clock(), None, "node gone")
    launcher.pending_reports.append(lost)
    service.step()
    with engine.connect() as conn:
        kept = {node: (r.run_s, r.interruptions) for node, r in interruptions.records(conn, nodes).items()}
        mtbi = interruptions.attempt_mtbi_s(conn, dict.fromkeys(nodes, prior), clock())
    assert kept == {node: (pytest.approx(3600.0), pytest.approx(0.5)) for node in nodes}
    assert mtbi == pytest.approx(1 / (2 * (0.5 + 1) / (3600.0 + prior)))


def test_heartbeats_renew_with_the_right_token_only(
    engine: Engine, settings: Settings, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec())
    service.step()
    request = next(iter(launcher.launched.values()))
    with TestClient(create_app(settings, engine, fleet=FLEET, clock=clock)) as api:
        url = f"/v1/attempts/{request.attempt_id}/heartbeat"
        secret = {"Authorization": f"Bearer {request.attempt_secret}"}
        clock.advance(30)
        good = api.post(
            url,
            headers=secret,
            json={
                "fencing_token": request.fencing_token,
                "step": 10,
                "checkpoint": {"url": "file:///tmp/gpuyard-ckpt/flights/step-10", "step": 10, "cost_s": 4.0},
            },
        )
        assert good.status_code == 200, good.text
        assert good.json()["action"] == "continue"
        assert datetime.fromisoformat(good.json()["lease_expires_at"]) == clock() + timedelta(seconds=60)
        assert good.json()["checkpoint_interval_s"] > 0  # Young/Daly from the measured 4 s cost
        assert state(engine, job_id) == "RUNNING"
        stale = api.post(
            url,
            headers=secret,
            json={
                "fencing_token": request.fencing_token - 1,
                "step": 99,
                "checkpoint": {"url": "file:///zombie", "step": 99},
            },
        )
        assert stale.status_code == 409 and stale.json()["type"] == "/problems/stale-token"
        unknown = api.post("/v1/attempts/nope/heartbeat", headers=secret, json={"fencing_token": 1})
        assert unknown.status_code == 401
    with engine.connect() as conn:
        job = job_store.get(conn, job_id)
        assert (
            job is not None
            and job.checkpoint_url == "file:///tmp/gpuyard-ckpt/flights/step-10"
            and job.checkpoint_step == 10
        )
        attempt = attempt_store.attempt(conn, request.attempt_id)
        assert attempt is not None and attempt.step == 10


def test_an_expired_lease_requeues_and_the_retry_resumes_from_the_checkpoint(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec())
    service.step()
    first = next(iter(launcher.launched.values()))
    saved = {"url": "file:///tmp/gpuyard-ckpt/flights/120", "step": 120, "saved_at": clock()}
    beat(engine, first, clock, 120, saved)
    clock.advance(61)  # silence: the worker died with its node
    service.step()
    with engine.connect() as conn:
        lost = attempt_store.attempt(conn, first.attempt_id)
        job = job_store.get(conn, job_id)
    assert lost is not None and lost.state.value == "LOST" and "lease expired" in (lost.reason or "")
    assert launcher.released == [first.attempt_id]  # stopped before its job was placed again
    assert job is not None and job.failures == 0 and job.attempt_count == 2  # requeued and placed again
    second = [r for r in launcher.launched.values() if r.attempt_id != first.attempt_id]
    assert len(second) == 1 and second[0].fencing_token > first.fencing_token
    with engine.connect() as conn:
        retry = attempt_store.attempt(conn, second[0].attempt_id)
    assert (
        retry is not None
        and retry.checkpoint_step == 120
        and retry.checkpoint_url == "file:///tmp/gpuyard-ckpt/flights/120"
    )
    with pytest.raises(attempt_store.Unproven):  # the old worker, back from the dead: its secret died
        beat(engine, first, clock, step=130)


def test_a_repeated_checkpoint_does_not_move_the_point_lost_progress_counts_from(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """A worker repeats its newest checkpoint in every beat until one is answered (found by fault
    seed 310: the repeat moved `checkpoint_at`, and the preemption was charged 1.5 s, not 8)."""
    submit(engine, clock, spec())
    service.step()
    first = next(iter(launcher.launched.values()))
    attempt_store.mark_running(engine, first.attempt_id, clock())
    saved = {"url": "file:///tmp/gpuyard-ckpt/flights/120", "step": 120}
    clock.advance(5)
    beat(engine, first, clock, 120, saved)
    saved_at = clock()
    clock.advance(8)
    beat(engine, first, clock, 120, saved)  # the same checkpoint again
    with engine.begin() as conn:
        events = conn.execute(
            select(func.count())
            .select_from(events_table)
            .where(events_table.c.type == "attempt.checkpointed")
        ).scalar()
    assert events == 1
    clock.advance(2)
    with engine.begin() as conn:
        attempt_store.finish(
            conn,
            first.attempt_id,
            AttemptState.PREEMPTED,
            at=clock(),
            exit_code=exit_codes.PREEMPTED,
            reason="r",
            disrupted=True,
        )
    with engine.connect() as conn:
        ended = attempt_store.attempt(conn, first.attempt_id)
    assert ended is not None and ended.checkpoint_at == saved_at
    assert ended.progress_lost_s == pytest.approx(10.0)


def test_failures_use_the_budget_preemption_does_not(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec(retry={"max_failures": 1, "backoff": "10s"}))
    outcomes = [
        (Outcome.PREEMPTED, exit_codes.PREEMPTED),
        (Outcome.FAILED, exit_codes.FAILURE),
        (Outcome.LOST, None),
        (Outcome.FAILED, exit_codes.FAILURE),
    ]
    for outcome, code in outcomes:
        service.step()
        current = live_attempts(engine, job_id)
        assert len(current) == 1
        if outcome == Outcome.PREEMPTED:  # a preemption is one only when the platform asked for it
            assert attempt_store.request_stop(engine, current[0].attempt.id, at=clock(), why="evicted")
        launcher.pending_reports.append(WorkerReport(current[0].attempt.id, outcome, clock(), code, "test"))
        service.step()
        clock.advance(11)  # past the backoff
    with engine.connect() as conn:
        job = job_store.get(conn, job_id)
    assert job is not None and job.state.value == "FAILED" and job.failures == 2 and job.attempt_count == 4


@pytest.mark.parametrize(
    ("outcome", "code"),
    [(Outcome.PREEMPTED, exit_codes.PREEMPTED), (Outcome.LOST, exit_codes.STALE_FENCING_TOKEN)],
    ids=["exit-75", "exit-76"],
)
def test_a_worker_that_stops_unasked_spends_the_budget_with_backoff(
    engine: Engine,
    service: SchedulerService,
    launcher: RecordingLauncher,
    clock: Clock,
    outcome: Outcome,
    code: int,
) -> None:
    """Exit 75 ("preempted") when nobody asked it to stop, or 76 ("stale token") while its token was
    current, is the job's own failure: the review saw `max_failures: 0` and `exit 75` run 133 attempts
    in 15 s. Now the first such exit fails the job, and with a budget each retry waits its backoff."""
    once = submit(engine, clock, spec(name="once", retry={"max_failures": 0}))
    twice = submit(engine, clock, spec(name="twice", retry={"max_failures": 1, "backoff": "30s"}))
    service.step()
    for job_id in (once, twice):
        (current,) = live_attempts(engine, job_id)
        launcher.pending_reports.append(WorkerReport(current.attempt.id, outcome, clock(), code, "test"))
    service.step()
    assert state(engine, once) == "FAILED"
    with engine.connect() as conn:
        job = job_store.get(conn, twice)
        ended = attempt_store.attempt(conn, current.attempt.id)
    expected = "nobody asked" if code == exit_codes.PREEMPTED else "was live and current"
    assert ended is not None and ended.state.value == "FAILED" and expected in (ended.reason or "")
    assert job is not None and job.state.value == "PENDING" and job.failures == 1
    assert job.not_before == clock() + timedelta(seconds=30)
    service.step()
    assert live_attempts(engine, twice) == []  # not placed again within the backoff
    clock.advance(31)
    service.step()
    assert len(live_attempts(engine, twice)) == 1


def test_a_job_lost_again_and_again_backs_off_and_is_capped_per_hour(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """A flapping node: each attempt is lost as soon as it runs. The first loss resumes at once, the
    next ones wait 10 s, 20 s, 40 s, 80 s; the sixth within the hour waits until the first is an hour
    old. Each wait is in the job's reason (and its event)."""
    job_id = submit(engine, clock, spec(retry={"lost_backoff": "10s", "lost_per_hour": 6}))
    first_loss = None
    waits = []
    for _ in range(6):
        service.step()
        (current,) = live_attempts(engine, job_id)
        report = WorkerReport(current.attempt.id, Outcome.LOST, clock(), None, "node d0n0 NotReady")
        launcher.pending_reports.append(report)
        service.step()
        first_loss = first_loss or clock()
        with engine.connect() as conn:
            job = job_store.get(conn, job_id)
            (why,) = conn.execute(  # the job's event for this loss
                select(events_table.c.data["reason"].as_string())
                .where(events_table.c.job_id == job_id, events_table.c.type == "job.pending")
                .order_by(events_table.c.seq.desc())
                .limit(1)
            ).one()
        assert job is not None and job.failures == 0
        wait = (
            (job.not_before - clock()).total_seconds() if job.not_before and job.not_before > clock() else 0
        )
        waits.append((round(wait), why))
        if wait:
            service.step()
            assert live_attempts(engine, job_id) == []  # not placed again within the wait
            clock.advance(wait)
    assert [w for w, _ in waits] == [0, 10, 20, 40, 80, 3600 - 150]
    assert waits[0][1] == "lost: node d0n0 NotReady; resumes"
    assert waits[1][1] == "lost: node d0n0 NotReady; lost 2 times within an hour: resumes in 10s"
    assert "lost 6 times within an hour (retry.lost_per_hour 6): resumes in 3450s" in (waits[5][1] or "")
    assert clock() == first_loss + timedelta(hours=1)  # six losses, and the next attempt an hour on
    service.step()
    assert len(live_attempts(engine, job_id)) == 1


def test_priority_preemption_stops_the_victim_then_places_the_job(
    engine: Engine, settings: Settings, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    low = [submit(engine, clock, spec(name=f"low{i}", priority="low", preemptible=True)) for i in range(4)]
    service.step()
    assert len(launcher.launched) == 4  # the fleet is full
    urgent = submit(engine, clock, spec(name="urgent", priority="high"))
    service.step()
    assert len(launcher.cancelled) == 1
    victim_id, grace = launcher.cancelled[0]
    assert grace == service.grace_s
    victim = launcher.launched[victim_id]
    assert beat(engine, victim, clock, step=5).action == "checkpoint_and_stop"
    service.step()
    assert len(launcher.cancelled) == 1  # no second victim while the first one stops
    launcher.pending_reports.append(WorkerReport(victim_id, Outcome.PREEMPTED, clock(), 75, "saved"))
    service.step()
    assert state(engine, urgent) in ("SCHEDULED", "RUNNING")
    victim_job = victim.job_id
    assert state(engine, victim_job) == "PENDING"
    with engine.connect() as conn:
        job = job_store.get(conn, victim_job)
    assert job is not None and job.failures == 0 and set(low) >= {victim_job}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_service_keeps_its_fleet_index_from_pass_to_pass_until_the_fleet_changes(
    engine: Engine, launcher: RecordingLauncher, clock: Clock
) -> None:
    """What cycles derive from the fleet alone (nodes, domains, the filters' answers per job shape)
    belongs to the service: derived once, kept while the fleet is the same, derived again when not."""
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=16), clock())
    fleets = [FLEET]
    service = SchedulerService(
        engine, launcher, lambda: fleets[-1], api_url=lambda: "http://api", clock=clock
    )
    index = service.fleet_index()
    submit(engine, clock, spec())
    assert len(service.schedule().placed) == 1
    assert service.fleet_index() is index and index.eligible(service.policy.filters)  # filled by the pass
    fleets.append(FLEET.model_copy(deep=True))  # the same fleet, read again
    assert service.fleet_index() is index
    fleets.append(Fleet(nodes=FLEET.nodes[:2]))  # a domain went away
    changed = service.fleet_index()
    assert (
        changed is not index and changed.fleet is fleets[-1] and not changed.eligible(service.policy.filters)
    )


def specs_alive(name: str) -> int:
    """How many JobSpecs named `name` this process still holds (after a full collection)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, JobSpec) and o.name == name)


def test_the_service_keeps_the_specs_of_live_jobs_only(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """Each job's spec is validated once while the job is read pass after pass, and nothing of it is
    kept once the job ended, whichever process ended it: after a burst, the memory of the backlog
    goes (the load benchmark's rss_mb_per_10k)."""
    name = f"kept-{uuid.uuid4().hex[:8]}"
    ids = [submit(engine, clock, spec(name=name)) for _ in range(5)]  # 4 fit on the 16 GPUs, 1 waits
    service.step()
    assert len(launcher.launched) == 4
    (waiting,) = set(ids) - {r.job_id for r in launcher.launched.values()}
    seen = service.snapshot(clock())[2][waiting].spec
    service.step()
    assert service.snapshot(clock())[2][waiting].spec is seen  # validated once, pass after pass
    del seen

    job_store.cancel(engine, waiting, at=clock(), by="someone")  # in another process: the API's
    for attempt_id in launcher.launched:
        launcher.pending_reports.append(WorkerReport(attempt_id, Outcome.SUCCEEDED, clock(), 0, "exited 0"))
    service.step()
    assert {state(engine, j) for j in ids} == {"SUCCEEDED", "CANCELLED"}
    service.step()
    launcher.launched.clear()  # the test's own references to the specs
    assert specs_alive(name) == 0


def test_a_reserved_but_unlaunched_attempt_is_launched_once_after_a_restart(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec())
    # The scheduler reserved and then died before launching.
    pending, snapshot, _ = service.snapshot(clock())
    from gpuyard.scheduler.cycle import run_cycle

    placed = run_cycle(pending, snapshot, clock(), service.policy).placed[0]
    (reserved,) = reserve_batch(
        engine, [Reservation(job_id, placed.placement, False)], at=clock(), lease_ttl_s=60
    )
    assert reserved is not None and launcher.launch_calls == []
    restarted = SchedulerService(engine, launcher, FLEET, api_url=lambda: "http://api", clock=clock)
    restarted.recover()
    restarted.recover()
    restarted.step()
    assert launcher.launch_calls.count(reserved.id) >= 1 and len(launcher.launched) == 1
    assert len(live_attempts(engine, job_id)) == 1
    # The workers get the secret reserved with the attempt: the store keeps it for whichever replica launches.
    assert (
        reserved.attempt_secret and launcher.launched[reserved.id].attempt_secret == reserved.attempt_secret
    )


class RefusingLauncher(RecordingLauncher):
    """Starts part of an attempt, then the cluster refuses the rest."""

    def launch(self, request: LaunchRequest) -> None:
        super().launch(request)
        raise RuntimeError("pods is forbidden: exceeded quota")


def test_a_launch_the_cluster_refuses_counts_as_a_failure_and_cleans_up(
    engine: Engine, service: SchedulerService, clock: Clock
) -> None:
    service.launcher = launcher = RefusingLauncher()
    job_id = submit(engine, clock, spec(retry={"max_failures": 1, "backoff": "30s"}))
    service.step()
    detail = job_store.detail(engine, job_id)
    assert detail is not None and [a.state.value for a in detail.attempts] == ["FAILED"]
    first = detail.attempts[0]
    assert "launch failed: pods is forbidden" in (first.reason or "")
    assert (first.id, 0) in launcher.cancelled  # what did start is stopped
    assert (detail.job.state.value, detail.job.failures) == ("PENDING", 1)
    with engine.connect() as conn:  # its GPUs are free again
        assert conn.execute(select(func.count()).select_from(leases)).scalar() == 0
    service.step()
    assert len(launcher.launch_calls) == 1  # within the backoff: no retry yet
    clock.advance(31)
    service.step()  # the second refusal spends the budget: the job fails instead of retrying forever
    assert len(launcher.launch_calls) == 2 and state(engine, job_id) == "FAILED"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_two_replicas_run_concurrently_and_launch_each_job_once(
    engine: Engine, launcher: RecordingLauncher
) -> None:
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=64), datetime.now(UTC))
    jobs = [
        job_store.submit(
            engine,
            parse_spec(spec(name=f"j{i}", gpus=1)),
            idempotency_key=None,
            created_by="t",
            at=datetime.now(UTC),
        )[0].id
        for i in range(12)
    ]
    stop = threading.Event()
    replicas = [
        SchedulerService(engine, launcher, FLEET, api_url=lambda: "http://api", holder=f"r{i}", lease_ttl_s=4)
        for i in range(2)
    ]
    threads = [threading.Thread(target=r.run, args=(stop,), kwargs={"interval_s": 0.05}) for r in replicas]
    for thread in threads:
        thread.start()
    try:
        from servers import wait_until

        wait_until(lambda: len(launcher.launched) == 12, what="every job launched")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert sorted(launcher.launch_calls) == sorted(launcher.launched)  # no attempt launched twice
    assert sum(r.lead is not None for r in replicas) <= 1
    assert {r.job_id for r in launcher.launched.values()} == set(jobs)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "submit-gang", "succeed", "fail", "preempt", "lose", "crash", "tick"]),
            st.integers(0, 7),
        ),
        min_size=5,
        max_size=30,
    )
)
@pytest.mark.slow
def test_no_gpu_is_ever_leased_twice_and_gangs_stay_in_one_domain(
    tmp_path_factory: Any, operations: Any
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'g.db'}")
    migrate(engine)
    clock, launcher = Clock(), RecordingLauncher()
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=16, cohort="x"), clock())
    service = SchedulerService(engine, launcher, FLEET, api_url=lambda: "http://api", clock=clock)
    outcomes = {
        "succeed": Outcome.SUCCEEDED,
        "fail": Outcome.FAILED,
        "preempt": Outcome.PREEMPTED,
        "lose": Outcome.LOST,
    }
    for number, (operation, pick) in enumerate(operations):
        if operation.startswith("submit"):
            gang = operation == "submit-gang"
            submit(
                engine,
                clock,
                spec(
                    name=f"j{number}",
                    gpus=8 if gang else 1 + pick % 4,
                    nodes=2 if gang else 1,
                    preemptible=True,
                    priority=["low", "normal", "high"][pick % 3],
                ),
            )
        elif operation in outcomes:
            with engine.connect() as conn:
                live = attempt_store.live(conn)
            if live:
                target = live[pick % len(live)].attempt.id
                launcher.pending_reports.append(
                    WorkerReport(target, outcomes[operation], clock(), None, operation)
                )
        elif operation == "crash":  # a new scheduler process takes over
            service = SchedulerService(engine, launcher, FLEET, api_url=lambda: "http://api", clock=clock)
            service.recover()
        else:
            clock.advance(40)
        service.step()
        with engine.connect() as conn:
            live = attempt_store.live(conn)
            leased = conn.execute(select(leases.c.node, leases.c.gpu_index, leases.c.attempt_id)).all()
        claimed = [
            (n["node"], g) for item in live for n in item.attempt.placement["nodes"] for g in n["gpus"]
        ]
        assert len(claimed) == len(set(claimed)), "a GPU is held by two live attempts"
        assert len({(node, gpu) for node, gpu, _ in leased}) == len(leased)
        for item in live:
            domains = {
                node.domain
                for node in FLEET.nodes
                if node.name in {n["node"] for n in item.attempt.placement["nodes"]}
            }
            assert len(domains) == 1, "a gang was split across domains"
        per_job: dict[str, int] = {}
        for item in live:
            per_job[item.job.id] = per_job.get(item.job.id, 0) + 1
        assert all(count == 1 for count in per_job.values()), "a job has two live attempts"
    engine.dispose()


def test_platform_metrics_summarize_what_happened(
    engine: Engine, settings: Settings, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec(gpus=4))
    clock.advance(10)  # queued 10 s
    service.step()
    first = next(iter(launcher.launched.values()))
    attempt_store.mark_running(engine, first.attempt_id, clock())
    saved = {"url": "file:///tmp/gpuyard-ckpt/flights/50", "step": 50, "saved_at": clock()}
    beat(engine, first, clock, 50, saved)
    clock.advance(100)  # 100 s after the checkpoint the node is lost
    launcher.pending_reports.append(WorkerReport(first.attempt_id, Outcome.LOST, clock(), None, "node lost"))
    service.step()
    second = next(r for r in launcher.launched.values() if r.attempt_id != first.attempt_id)
    attempt_store.mark_running(engine, second.attempt_id, clock())
    clock.advance(20)  # its workers restore step 50 in 20 s: no new step yet
    beat(engine, second, clock, 50, restore={"step": 50, "seconds": 20.0}, checkpoint_stall_s=0.0)
    clock.advance(100)  # a new step; 15 s of checkpoint writes paused the steps so far
    beat(engine, second, clock, 60, checkpoint_stall_s=15.0)
    clock.advance(180)
    launcher.pending_reports.append(WorkerReport(second.attempt_id, Outcome.SUCCEEDED, clock(), 0, "done"))
    service.step()
    assert state(engine, job_id) == "SUCCEEDED"
    with TestClient(create_app(settings, engine, fleet=FLEET, clock=clock)) as api:
        with engine.begin() as conn:
            admin = team_store.create_token(conn, "a", team_store.Role.PLATFORM_ADMIN, clock())
        summary = api.get("/v1/metrics/summary", headers={"Authorization": f"Bearer {admin}"}).json()
        assert summary["queue_wait_p50_s"] == 10.0
        assert summary["lost_gpu_hours"] == pytest.approx(100 * 4 / 3600)
        assert summary["leased_gpu_hours"] == pytest.approx(400 * 4 / 3600)
        # Useful: the second attempt's 300 s less its 20 s restore and 15 s of stalls; the first kept
        # nothing (all 100 s of it came after its checkpoint).
        assert summary["useful_gpu_hours"] == pytest.approx(265 * 4 / 3600)
        assert summary["goodput"] == pytest.approx(265 / 400)
        assert summary["resumes"] == 1 and summary["resume_success_share"] == 1.0
        assert summary["fair_share_attainment"] == {"a": pytest.approx(1.0)}
        scraped = api.get("/metrics").text
        assert "gpuyard_goodput_ratio 0.6625" in scraped


def test_a_plain_command_lives_on_its_launchers_renewals_alone(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """No heartbeat ever: while the launcher sees the workers alive it renews the lease, for as many
    lease periods as the command runs; once it does not, the lease passes and the attempt is LOST."""
    job_id = submit(engine, clock, spec())
    service.step()
    (request,) = launcher.launched.values()
    launcher.running.add(request.attempt_id)
    for _ in range(6):  # three lease periods, a pass every half period
        clock.advance(30)
        service.step()
    (attempt,) = live_attempts(engine, job_id)
    assert attempt.attempt.state.value == "RUNNING" and attempt.job.state.value == "RUNNING"
    launcher.running.clear()  # the launcher no longer sees them (cut off, or they vanished unseen)
    clock.advance(61)
    service.step()
    with engine.connect() as conn:
        lost = attempt_store.attempt(conn, request.attempt_id)
    assert (
        lost is not None
        and lost.state.value == "LOST"
        and "neither its workers nor its launcher" in (lost.reason or "")
    )


def test_a_lease_that_passed_is_not_reaped_while_the_workers_may_still_run(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec())
    service.step()
    (request,) = launcher.launched.values()
    launcher.releasable = False  # e.g. the pods are on a node that is still Ready but unreachable
    clock.advance(61)
    service.step()
    assert launcher.released == [request.attempt_id]
    assert [a.attempt.id for a in live_attempts(engine, job_id)] == [request.attempt_id]  # no second attempt
    launcher.releasable = True
    service.step()
    assert state(engine, job_id) in ("PENDING", "SCHEDULED") and len(launcher.launched) == 2


def test_a_hung_job_is_stopped_after_its_progress_timeout_and_retried_with_backoff(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(
        engine,
        clock,
        spec(liveness={"progress_timeout": "5m"}, retry={"max_failures": 1, "backoff": "1m"}),
    )
    service.step()
    (request,) = launcher.launched.values()
    launcher.running.add(request.attempt_id)  # alive all along: the lease is not what ends it
    for minute in range(4):  # progress for a while, then the step stays at 3
        beat(engine, request, clock, step=minute)
        clock.advance(60)
    for _ in range(5):
        assert beat(engine, request, clock, step=3).action == "continue"
        service.step()
        clock.advance(60)
    assert launcher.cancelled == []  # 5 minutes without progress: not yet past the timeout
    clock.advance(30)
    service.step()
    assert launcher.cancelled == [(request.attempt_id, service.grace_s)]  # SIGTERM, time to checkpoint
    assert beat(engine, request, clock, step=3).action == "checkpoint_and_stop"
    launcher.pending_reports.append(WorkerReport(request.attempt_id, Outcome.PREEMPTED, clock(), 75, "saved"))
    service.step()
    with engine.connect() as conn:
        ended = attempt_store.attempt(conn, request.attempt_id)
        job = job_store.get(conn, job_id)
    assert ended is not None and ended.state.value == "FAILED" and "progress_timeout" in (ended.reason or "")
    assert job is not None and job.state.value == "PENDING" and job.failures == 1
    assert job.not_before == clock() + timedelta(minutes=1)


def test_max_runtime_counts_from_the_first_start_across_attempts_and_is_not_retried(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job_id = submit(engine, clock, spec(max_runtime="10m", preemptible=True))
    service.step()
    (first,) = launcher.launched.values()
    beat(engine, first, clock, step=1)
    for _ in range(6):
        clock.advance(60)
        beat(engine, first, clock, step=1)
    assert attempt_store.request_stop(engine, first.attempt_id, at=clock(), why="evicted")
    launcher.pending_reports.append(WorkerReport(first.attempt_id, Outcome.PREEMPTED, clock(), 75, "saved"))
    service.step()  # preempted after 6 minutes; the next attempt starts
    second = next(r for r in launcher.launched.values() if r.attempt_id != first.attempt_id)
    launcher.running.add(second.attempt_id)
    for _ in range(6):
        clock.advance(30)
        service.step()
    assert (second.attempt_id, service.grace_s) not in launcher.cancelled  # 9 minutes in all
    for _ in range(4):
        clock.advance(30)
        service.step()
    assert (second.attempt_id, service.grace_s) in launcher.cancelled
    launcher.pending_reports.append(WorkerReport(second.attempt_id, Outcome.PREEMPTED, clock(), 75, "saved"))
    service.step()
    with engine.connect() as conn:
        job = job_store.get(conn, job_id)
    assert job is not None and job.state.value == "FAILED" and "max_runtime" in (job.reason or "")


def test_a_report_the_store_could_not_take_comes_again(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """At least once: the review saw one store error drop a whole batch of outcomes (the attempt later
    became LOST and a SUCCEEDED job ran again). A report is acknowledged only once the store has it."""
    job_id = submit(engine, clock, spec())
    service.step()
    (request,) = launcher.launched.values()
    done = WorkerReport(request.attempt_id, Outcome.SUCCEEDED, clock(), 0, "exited 0")
    launcher.pending_reports.append(done)
    finish = attempt_store.finish
    failures = iter([OperationalError("UPDATE attempts", {}, Exception("connection reset"))])

    def flaky(*args: Any, **kwargs: Any) -> bool:
        if (error := next(failures, None)) is not None:
            raise error
        return finish(*args, **kwargs)

    attempt_store.finish = flaky  # type: ignore[assignment]
    try:
        service.step()
        assert launcher.acknowledged == [] and launcher.pending_reports == [done]
        service.step()
    finally:
        attempt_store.finish = finish  # type: ignore[assignment]
    assert launcher.acknowledged == [done] and state(engine, job_id) == "SUCCEEDED"


def test_reports_are_recorded_in_one_transaction_and_one_refused_leaves_the_rest(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    """A pass records its reports together (one commit per batch, so an ending reaches followers as
    soon as the pass sees it); a report the store refuses is rolled back to its own savepoint and comes
    again, while the others of its batch are recorded and acknowledged."""
    first, second = submit(engine, clock, spec("one")), submit(engine, clock, spec("two"))
    service.step()
    by_job = {r.job_id: r for r in launcher.launched.values()}
    refused = WorkerReport(by_job[first].attempt_id, Outcome.SUCCEEDED, clock(), 0, "exited 0")
    taken = WorkerReport(by_job[second].attempt_id, Outcome.SUCCEEDED, clock(), 0, "exited 0")
    launcher.pending_reports += [refused, taken]
    finish = attempt_store.finish
    commits: list[int] = []

    def refuse_the_first(conn: Any, attempt_id: str, *args: Any, **kwargs: Any) -> bool:
        finish(conn, attempt_id, *args, **kwargs)  # its writes are made, then undone by the savepoint
        if attempt_id == refused.attempt_id:
            raise OperationalError("UPDATE jobs", {}, Exception("serialization failure"))
        return True

    def count(conn: Any) -> None:
        commits.append(1)

    attempt_store.finish = refuse_the_first  # type: ignore[assignment]
    event.listen(engine, "commit", count)
    try:
        service.apply(launcher.observe())
    finally:
        attempt_store.finish = finish  # type: ignore[assignment]
        event.remove(engine, "commit", count)
    assert len(commits) == 1
    assert launcher.acknowledged == [taken] and launcher.pending_reports == [refused]
    assert (state(engine, first), state(engine, second)) == ("SCHEDULED", "SUCCEEDED")
    service.step()
    assert state(engine, first) == "SUCCEEDED" and launcher.acknowledged == [taken, refused]


def test_a_node_takes_only_the_jobs_whose_cpu_and_memory_fit_beside_its_attempts(
    engine: Engine, launcher: RecordingLauncher, clock: Clock
) -> None:
    """One 8-GPU node of 16 CPUs and 64 GB: 2-GPU jobs of 6 CPUs fit two at a time, GPUs to spare; a
    job of 40 GB waits for the memory an attempt holds. Each pass reads what live attempts use from
    the store, so the rule holds across passes and replicas."""
    node = Node(
        name="n0", site="east", cluster="c", domain="d0", gpu_type="a100", gpus=8, cpu=16, memory_gb=64
    )
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=8), clock())
    service = SchedulerService(
        engine, launcher, Fleet(nodes=(node,)), api_url=lambda: "http://api", clock=clock, lease_ttl_s=60
    )
    cpu_bound = [
        submit(engine, clock, spec(f"cpu-{i}", gpus=2, resources={"gpus": 2, "cpu": 6})) for i in range(3)
    ]
    for _ in range(3):
        service.step()
    states = {j: state(engine, j) for j in cpu_bound}
    assert sorted(states.values()) == ["PENDING", "SCHEDULED", "SCHEDULED"]
    (waiting,) = [j for j, s in states.items() if s == "PENDING"]
    memory_bound = submit(engine, clock, spec("mem", gpus=2, resources={"gpus": 2, "memory": "40Gi"}))
    service.step()
    assert state(engine, memory_bound) == "SCHEDULED"  # 4 CPUs and 64 GB are left beside the two
    big = submit(engine, clock, spec("big", gpus=2, resources={"gpus": 2, "memory": "40Gi"}))
    service.step()
    assert state(engine, big) == "PENDING" and state(engine, waiting) == "PENDING"  # 2 GPUs are free
    first = next(r for r in launcher.launched.values() if r.job_id != memory_bound)
    launcher.pending_reports.append(WorkerReport(first.attempt_id, Outcome.SUCCEEDED, clock(), 0, "exited 0"))
    service.step()
    service.step()
    assert state(engine, waiting) == "SCHEDULED"  # the first one's CPUs were given back
