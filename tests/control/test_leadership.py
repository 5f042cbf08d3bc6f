"""Leader leases: judged by the database's clock at the statement, fenced by an epoch, and a pass
whose lead passed writes nothing (store/leadership.py, SchedulerService.hold_lead): the reservations
production makes (`reserve_batch` with the pass's `lead`) confirm the lead in their transaction, so a
replica that lost the lead cannot reserve, whichever of the two comes first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.model import Attempt, Job
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers.base import LaunchRequest
from gpuyard.scheduler.service import SchedulerService
from gpuyard.store import jobs as job_store
from gpuyard.store import leadership
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from gpuyard.store.leadership import Lead, NotLeading
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.tables import attempts, leaders
from servers import wait_until
from sqlalchemy import Engine, event, func, select, text, update
from sqlalchemy.exc import DBAPIError
from stores import empty_store

from .conftest import EXAMPLE_SPEC
from .test_scheduler_service import FLEET, Clock, RecordingLauncher
from .test_store_races import interleave, waits_on_a_lock

PLACEMENT = Placement("local", "local", "local", (NodeSlice("node-1", (0,)),))


def pending_job(engine: Engine) -> str:
    spec = parse_spec({**EXAMPLE_SPEC, "resources": {"gpus": 1, "gpu_types": ["cpu"]}})
    return job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=utcnow())[0].id


def attempt_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(attempts)).scalar_one())


# -- on SQLite, whose clock is the caller's --------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_one_leader_takeover_within_one_lease_period_and_a_new_epoch_each_time(engine: Engine) -> None:
    clock = Clock()

    def hold(holder: str) -> Lead | None:
        return leadership.hold(engine, "scheduler", holder, now=clock(), ttl_s=10)

    assert hold("one") == Lead("scheduler", "one", 1)
    assert hold("two") is None
    clock.advance(5)
    assert hold("one") == Lead("scheduler", "one", 1)  # renewed: the same lead
    clock.advance(9)
    assert hold("two") is None
    clock.advance(2)  # "one" died: its lease ran out
    assert hold("two") == Lead("scheduler", "two", 2)
    assert hold("one") is None
    clock.advance(11)
    assert hold("two") == Lead("scheduler", "two", 3)  # its own lease lapsed: nobody was sure to lead


@pytest.fixture
def scheduler_pair(engine: Engine) -> Iterator[tuple[SchedulerService, SchedulerService, Clock]]:
    clock = Clock()
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=16), clock())
    pair = [
        SchedulerService(
            engine,
            RecordingLauncher(),
            FLEET,
            api_url=lambda: "http://api",
            clock=clock,
            holder=name,
            lease_ttl_s=20,
        )
        for name in ("a", "b")
    ]
    yield pair[0], pair[1], clock


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_pass_whose_lead_passed_reserves_nothing(
    engine: Engine, scheduler_pair: tuple[SchedulerService, SchedulerService, Clock]
) -> None:
    a, b, clock = scheduler_pair
    assert a.hold_lead()
    submit = {**EXAMPLE_SPEC, "resources": {"gpus": 1, "gpu_types": ["a100"]}}
    job_store.submit(engine, parse_spec(submit), idempotency_key=None, created_by="t", at=clock())
    clock.advance(11)  # a's pass is held up past its lease (ttl/2), and b takes the lead
    assert b.hold_lead()
    with pytest.raises(NotLeading):
        a.schedule()
    assert attempt_count(engine) == 0 and a.launcher.launch_calls == []
    b.schedule()
    assert attempt_count(engine) == 1 and len(b.launcher.launch_calls) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_pass_longer_than_the_leads_period_keeps_the_lead(
    engine: Engine, scheduler_pair: tuple[SchedulerService, SchedulerService, Clock]
) -> None:
    """Under load a pass outlasted the lead's period (half a lease) and the other replica took the
    lead in the middle of it, pass after pass: the lead went back and forth and no pass completed.
    A pass renews the lead as it goes (here four steps of 4 s, 16 s against a period of 10 s)."""
    a, b, clock = scheduler_pair
    assert a.hold_lead()
    for _ in range(4):
        clock.advance(4)
        with a.fenced():
            pass
        assert not b.hold_lead()
    assert a.lead == Lead("scheduler", "a", 1)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_pass_whose_lead_lapsed_stops_even_when_nobody_took_it(
    engine: Engine, scheduler_pair: tuple[SchedulerService, SchedulerService, Clock]
) -> None:
    """Paused past its lead's period, a replica's pass stops at its next write, though no other took
    the lead: in between nobody was sure to lead. Its next look takes the lead under a new epoch."""
    a, _, clock = scheduler_pair
    assert a.hold_lead()
    clock.advance(11)
    with pytest.raises(NotLeading):
        a.fenced()
    assert a.hold_lead() and a.lead == Lead("scheduler", "a", 2)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_replica_that_lost_and_regained_the_lead_between_two_looks_recovers(
    engine: Engine, scheduler_pair: tuple[SchedulerService, SchedulerService, Clock]
) -> None:
    """While `a` looked away, `b` led and reserved an attempt it never launched (it died). `a` sees
    only that it leads again, but under a new epoch: it recovers, and launches that attempt."""
    a, b, clock = scheduler_pair
    assert a.hold_lead()
    clock.advance(11)
    assert b.hold_lead()
    job_id = pending_job(engine)
    (reserved,) = reserve_batch(
        engine, [Reservation(job_id, PLACEMENT, False)], at=clock(), lease_ttl_s=20, lead=b.lead
    )
    assert reserved is not None
    clock.advance(11)  # b died before launching it
    assert a.hold_lead() and a.lead is not None and a.lead.epoch == 3
    assert a.launcher.launch_calls == [reserved.id]


# -- on PostgreSQL, whose clock is the server's ----------------------------------------------------

pg = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)


def led_by_one(engine: Engine, ttl_s: float = 30) -> tuple[Lead, str]:
    """An emptied store with team a and one pending job, and replica "one" holding the lead: (lead, job)."""
    empty_store(engine)
    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", TeamQuota(), utcnow())
    lead = leadership.hold(engine, "scheduler", "one", now=utcnow(), ttl_s=ttl_s)
    assert lead is not None
    return lead, pending_job(engine)


def lapse(engine: Engine) -> None:
    """The leader's lease passes now, on the database's clock (as if its renewals stopped)."""
    with engine.begin() as conn:
        conn.execute(update(leaders).values(expires_at=func.clock_timestamp() - timedelta(seconds=1)))


@pg
def test_a_callers_skewed_clock_neither_takes_a_live_lease_nor_writes_a_past_expiry(engine: Engine) -> None:
    assert leadership.hold(engine, "scheduler", "one", now=utcnow(), ttl_s=30) is not None
    ahead = utcnow() + timedelta(hours=1)  # two's clock is an hour fast (or its statement was held up)
    assert leadership.hold(engine, "scheduler", "two", now=ahead, ttl_s=30) is None
    behind = utcnow() - timedelta(hours=1)
    assert leadership.hold(engine, "scheduler", "one", now=behind, ttl_s=30) == Lead("scheduler", "one", 1)
    with engine.connect() as conn:
        left = conn.execute(
            select(func.extract("epoch", leaders.c.expires_at - func.clock_timestamp()))
        ).scalar_one()
    assert 25 < float(left) <= 30  # the expiry is the database's now plus the lease, not the caller's


@pg
def test_reservations_under_a_lead_that_passed_raise_and_write_nothing(engine: Engine) -> None:
    old, job_id = led_by_one(engine)
    lapse(engine)
    assert leadership.hold(engine, "scheduler", "two", now=utcnow(), ttl_s=30) == Lead("scheduler", "two", 2)
    with pytest.raises(NotLeading):
        reserve_batch(engine, [Reservation(job_id, PLACEMENT, False)], at=utcnow(), lease_ttl_s=60, lead=old)
    assert attempt_count(engine) == 0


class PauseAtBegin:
    """Holds the first transaction of `engine` as it begins, before any statement, until released."""

    def __init__(self, engine: Engine):
        self.reached, self.go = threading.Event(), threading.Event()
        event.listen(engine, "begin", self._hook)

    def _hook(self, _conn: Any) -> None:
        if not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(20), "the test never released the paused transaction"


@pg
def test_a_reservation_begun_under_a_lead_that_then_passed_writes_nothing(engine: Engine) -> None:
    """The pass reserves under its lead, as the service does (`reserve_batch(..., lead=...)`); its
    transaction is held as it begins, the lease passes on the database's clock and another replica
    takes the lead; then the reservation goes on, and must raise and write nothing. With the other
    interleaving (the lead confirmed first) the takeover waits for it: the test below."""
    lead, job_id = led_by_one(engine)
    paused = make_engine(engine.url.render_as_string(hide_password=False), pool_size=2)
    pause = PauseAtBegin(paused)
    wanted = [Reservation(job_id, PLACEMENT, False)]
    with ThreadPoolExecutor(1) as pool:
        reserving = pool.submit(reserve_batch, paused, wanted, at=utcnow(), lease_ttl_s=60, lead=lead)
        try:
            wait_until(pause.reached.is_set, what="the reservation's transaction to begin")
            lapse(engine)
            taken = leadership.hold(engine, "scheduler", "two", now=utcnow(), ttl_s=30)
        finally:
            pause.go.set()
        with pytest.raises(NotLeading):
            reserving.result(timeout=20)
    paused.dispose()
    assert taken == Lead("scheduler", "two", 2) and attempt_count(engine) == 0


@pg
def test_the_lead_cannot_change_hands_while_a_reservation_under_it_commits(engine: Engine) -> None:
    """The reservation confirmed its lead and is paused; the lease then passes on the database's
    clock, and the next replica's takeover waits on the lease row's lock (probed in pg_stat_activity)
    until the reservation commits: so the new leader's recovery sees that attempt."""
    lead, job_id = led_by_one(engine, ttl_s=1.0)

    def reserve(paused: Engine) -> object:
        (reserved,) = reserve_batch(
            paused, [Reservation(job_id, PLACEMENT, False)], at=utcnow(), lease_ttl_s=60, lead=lead
        )
        return reserved

    def take_over(other: Engine) -> tuple[Lead | None, int]:
        def passed() -> bool:
            with other.connect() as conn:
                return bool(conn.execute(text("SELECT clock_timestamp() > :at"), {"at": expiry}).scalar())

        wait_until(passed, what="the lease to pass on the database's clock")
        taken = leadership.hold(other, "scheduler", "two", now=utcnow(), ttl_s=30)
        return taken, attempt_count(other)

    with engine.connect() as conn:
        expiry = conn.execute(select(leaders.c.expires_at)).scalar_one()
    reserved, (taken, seen) = interleave(engine, reserve, r"(?s)FROM leaders.*FOR SHARE", take_over)
    assert reserved is not None
    assert taken == Lead("scheduler", "two", 2) and seen == 1


# -- side effects are fenced: a launch happens under the lead that claimed it, or not at all -------


class BlockingLauncher(RecordingLauncher):
    """A launch that takes as long as the test says: it is inside the launcher until released."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.go = threading.Event(), threading.Event()

    def launch(self, request: LaunchRequest) -> None:
        super().launch(request)
        self.inside.set()
        assert self.go.wait(20), "the test never let the launch finish"


def replica(engine: Engine, holder: str, launcher: RecordingLauncher, lease_ttl_s: float) -> SchedulerService:
    return SchedulerService(
        engine, launcher, FLEET, api_url=lambda: "http://api", holder=holder, lease_ttl_s=lease_ttl_s
    )


def reserved_under(engine: Engine, service: SchedulerService) -> tuple[Attempt, Job]:
    """`service` takes the lead and reserves a pending job under it (launched by nobody yet)."""
    empty_store(engine)
    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", TeamQuota(), utcnow())
    job_id = pending_job(engine)
    assert service.hold_lead()
    (attempt,) = reserve_batch(
        engine, [Reservation(job_id, PLACEMENT, False)], at=utcnow(), lease_ttl_s=60, lead=service.lead
    )
    assert attempt is not None
    with engine.connect() as conn:
        job = job_store.get(conn, job_id)
    assert job is not None
    return attempt, job


def attempt_state(engine: Engine, attempt_id: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(select(attempts.c.state).where(attempts.c.id == attempt_id)).scalar_one())


@pg
def test_a_launch_under_a_lead_that_passed_starts_nothing(engine: Engine) -> None:
    one = replica(engine, "one", RecordingLauncher(), lease_ttl_s=30)
    attempt, job = reserved_under(engine, one)
    lapse(engine)
    assert leadership.hold(engine, "scheduler", "two", now=utcnow(), ttl_s=30) is not None
    with pytest.raises(NotLeading):
        one.launch(attempt, job)
    assert one.launcher.launch_calls == [] and attempt_state(engine, attempt.id) == "CREATED"


def set_attempt_lease(engine: Engine, attempt_id: str, seconds_from_now: float) -> None:
    """The attempt's lease ends `seconds_from_now` on the database's clock (negative: it ran out)."""
    with engine.begin() as conn:
        conn.execute(
            update(attempts)
            .where(attempts.c.id == attempt_id)
            .values(lease_expires_at=func.clock_timestamp() + timedelta(seconds=seconds_from_now))
        )


@pg
def test_a_reservation_whose_lease_ran_out_is_not_launched_and_the_reaper_ends_it(engine: Engine) -> None:
    """A new leader's recovery finds a reservation whose lease ran out before anyone launched it: it
    launches nothing (a launch would run beside the attempt that replaces it), and the reaper ends it."""
    one = replica(engine, "one", RecordingLauncher(), lease_ttl_s=30)
    attempt, job = reserved_under(engine, one)
    set_attempt_lease(engine, attempt.id, -1)
    one.launch(attempt, job)
    assert one.launcher.launch_calls == [] and attempt_state(engine, attempt.id) == "CREATED"
    one.reap()
    assert attempt_state(engine, attempt.id) == "LOST"


@pg
def test_a_launch_renews_the_reservations_lease(engine: Engine) -> None:
    """Launched with a second of its reservation's lease left, a worker that ends before the launcher's
    first renewal (or the next pass) is not reaped as lost: the claim renewed the lease. (A full make
    test on a loaded machine once ran a job twice this way: its quick worker exited 0 just as the lease
    ran out, was reaped LOST, and the job ran again.)"""
    one = replica(engine, "one", RecordingLauncher(), lease_ttl_s=30)
    attempt, job = reserved_under(engine, one)
    set_attempt_lease(engine, attempt.id, 1)
    one.launch(attempt, job)
    assert one.launcher.launch_calls == [attempt.id]
    with engine.connect() as conn:
        left = conn.execute(
            select(func.extract("epoch", attempts.c.lease_expires_at - func.clock_timestamp())).where(
                attempts.c.id == attempt.id
            )
        ).scalar_one()
    assert 20 < float(left) <= 30
    one.reap()
    assert attempt_state(engine, attempt.id) == "LAUNCHING"


@pg
def test_the_lead_cannot_change_hands_while_a_launch_under_it_runs(engine: Engine) -> None:
    """One's launch is held inside the launcher; the next replica's takeover waits on the lease row
    (probed in pg_stat_activity) until it returns and its claim commits, so the new leader's recovery
    sees the attempt launched and launches nothing."""
    one = replica(engine, "one", BlockingLauncher(), lease_ttl_s=30)
    two = replica(engine, "two", RecordingLauncher(), lease_ttl_s=30)
    attempt, job = reserved_under(engine, one)

    def take_over() -> bool:
        lapse(engine)  # the lease passes, on the database's clock
        return two.hold_lead()

    with ThreadPoolExecutor(2) as pool:
        launching = pool.submit(one.launch, attempt, job)
        wait_until(one.launcher.inside.is_set, what="one's launch to be inside the launcher")
        taking = pool.submit(take_over)
        try:
            wait_until(lambda: waits_on_a_lock(engine), what="the takeover to wait on the lease row")
        finally:
            one.launcher.go.set()
        launching.result(timeout=20)
        assert taking.result(timeout=20) and two.lead is not None and two.lead.epoch == 2
    assert attempt_state(engine, attempt.id) == "LAUNCHING" and attempt_count(engine) == 1
    assert (one.launcher.launch_calls, two.launcher.launch_calls) == ([attempt.id], [])


@pg
def test_a_replica_paused_mid_launch_loses_its_claim_and_the_next_leader_launches_that_attempt(
    engine: Engine,
) -> None:
    """One stops inside the launcher for longer than half a lease: the server ends its transaction,
    which frees the lead and undoes its claim (still CREATED); the next leader's recovery launches the
    same attempt (a launcher adopts what one made, by name), and one's late commit fails."""
    # Its transaction may stay idle for half a lease: 3 s. With 1 s (a lease of 2 s), a thread of a
    # loaded make test stalled that long, twice, between the claim's statements, before the launcher.
    one = replica(engine, "one", BlockingLauncher(), lease_ttl_s=6)
    two = replica(engine, "two", RecordingLauncher(), lease_ttl_s=30)
    attempt, job = reserved_under(engine, one)
    with ThreadPoolExecutor(1) as pool:
        launching = pool.submit(one.launch, attempt, job)
        try:
            wait_until(one.launcher.inside.is_set, what="one's launch to be inside the launcher")
            wait_until(two.hold_lead, what="two to take the lead once one's transaction is ended")
        finally:
            one.launcher.go.set()
        with pytest.raises(DBAPIError):
            launching.result(timeout=20)
    assert two.launcher.launch_calls == [attempt.id] and attempt_count(engine) == 1
    assert attempt_state(engine, attempt.id) == "LAUNCHING"
