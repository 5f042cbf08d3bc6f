"""Reserve (store/reservations.py) on SQLite and PostgreSQL: the rows it writes, all or nothing per
gang, a conflicting gang does not sink its batch, leases expiring at `at` plus the lease period, and
two batches racing for the same GPUs and jobs (the interleaving forced with a held lock)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import JobState, StaleState
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch, reserve_in
from gpuyard.store.tables import attempts, events, jobs, leases
from gpuyard.store.transitions import JobMove, move_jobs
from sqlalchemy import Engine, create_engine, func, select, text, update

from .conftest import EXAMPLE_SPEC

AT = datetime(2026, 11, 30, 12, tzinfo=UTC)


@pytest.fixture(autouse=True)
def team(engine: Engine) -> None:
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=64), AT)


def submit(engine: Engine, name: str, gpus: int = 1) -> str:
    data = {**EXAMPLE_SPEC, "name": name, "resources": {"gpus": gpus, "gpu_types": ["a100"], "nodes": 1}}
    job, _ = job_store.submit(engine, parse_spec(data), idempotency_key=None, created_by="t", at=AT)
    return job.id


def on(node: str, *gpus: int) -> Placement:
    return Placement("east", "c", "d0", (NodeSlice(node, gpus),))


def table(engine: Engine, query: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(query).all())


def test_a_batch_writes_the_attempt_its_leases_and_the_job_move_of_every_gang(engine: Engine) -> None:
    ids = [submit(engine, f"j{i}", gpus=2) for i in range(3)]
    wanted = [
        Reservation(job_id, on("n1", 2 * i, 2 * i + 1), borrowed=i == 2) for i, job_id in enumerate(ids)
    ]
    made = reserve_batch(engine, wanted, at=AT, lease_ttl_s=60.0)
    (single,) = reserve_batch(
        engine,
        [Reservation(submit(engine, "single", gpus=2), on("n2", 0, 1), False)],
        at=AT,
        lease_ttl_s=60.0,
    )
    assert single is not None
    assert [a.job_id for a in made if a is not None] == ids
    tokens = [a.fencing_token for a in made if a is not None]
    assert len(set(tokens)) == 3 and tokens == sorted(tokens)  # fresh, in the cycle's order
    rows = {row.id: row for row in table(engine, select(attempts))}
    for attempt, reservation in zip(made, wanted, strict=True):
        assert attempt is not None and attempt.state.value == "CREATED" and attempt.number == 1
        row = rows[attempt.id]
        assert row.placement == reservation.placement.to_json() and row.borrowed == reservation.borrowed
        assert row.created_at == AT
    held = table(engine, select(leases).where(leases.c.node == "n1").order_by(leases.c.gpu_index))
    assert [(r.node, r.gpu_index) for r in held] == [("n1", g) for g in range(6)]
    (alone,) = {r.expires_at for r in table(engine, select(leases).where(leases.c.node == "n2"))}
    by_attempt = {a.id: a for a in made if a is not None}
    for lease in held:
        assert lease.fencing_token == by_attempt[lease.attempt_id].fencing_token
        # `at` + 60 s, the database's time in production (the service's clock), whatever the batch
        assert lease.expires_at == AT + timedelta(seconds=60) == alone == single.lease_expires_at
        assert rows[lease.attempt_id].lease_expires_at == lease.expires_at
    states = dict(table(engine, select(jobs.c.id, jobs.c.state)))
    assert {states[j] for j in ids} == {"SCHEDULED"}
    scheduled = table(engine, select(events.c.job_id).where(events.c.type == "job.scheduled"))
    assert sorted(j for (j,) in scheduled) == sorted([*ids, single.job_id])


def test_a_gang_that_conflicts_leaves_nothing_and_the_rest_of_the_batch_is_reserved(engine: Engine) -> None:
    blocker, gang, late, other = (submit(engine, name) for name in ("blocker", "gang", "late", "other"))
    (first,) = reserve_batch(engine, [Reservation(blocker, on("n1", 3), False)], at=AT, lease_ttl_s=60.0)
    assert first is not None
    with engine.begin() as conn:  # `late` was cancelled, or placed by another replica, meanwhile
        conn.execute(update(jobs).where(jobs.c.id == late).values(state="CANCELLED"))
    made = reserve_batch(
        engine,
        [
            Reservation(
                gang, Placement("east", "c", "d0", (NodeSlice("n1", (2, 3)), NodeSlice("n2", (0,)))), False
            ),
            Reservation(late, on("n3", 0), False),
            Reservation(other, on("n1", 0, 1), False),
        ],
        at=AT,
        lease_ttl_s=60.0,
    )
    assert made[0] is None and made[1] is None  # GPU n1:3 is the blocker's; `late` is not PENDING
    assert made[2] is not None and made[2].job_id == other
    held = {(r.node, r.gpu_index): r.attempt_id for r in table(engine, select(leases))}
    assert held == {("n1", 3): first.id, ("n1", 0): made[2].id, ("n1", 1): made[2].id}  # none of the gang's
    owners = {row.job_id for row in table(engine, select(attempts))}
    assert owners == {blocker, other}
    states = dict(table(engine, select(jobs.c.id, jobs.c.state)))
    assert (states[gang], states[late], states[other]) == ("PENDING", "CANCELLED", "SCHEDULED")


def test_two_gangs_of_one_batch_wanting_one_gpu_get_it_once(engine: Engine) -> None:
    a, b, c = (submit(engine, name) for name in "abc")
    made = reserve_batch(
        engine,
        [
            Reservation(a, on("n1", 0, 1), False),
            Reservation(b, on("n1", 1, 2), False),
            Reservation(a, on("n2", 0), False),  # the same job twice: only its first placement counts
            Reservation(c, on("n3", 0), False),
        ],
        at=AT,
        lease_ttl_s=60.0,
    )
    assert (made[0] is None) != (made[1] is None) and made[2] is None and made[3] is not None
    winner = made[0] or made[1]
    assert winner is not None
    held = table(engine, select(leases.c.attempt_id, func.count()).group_by(leases.c.attempt_id))
    assert sorted(count for _, count in held) == [1, 2]
    assert {attempt_id for attempt_id, _ in held} == {winner.id, made[3].id}


def test_a_second_batch_numbers_the_next_attempt_and_bad_sizes_are_refused(engine: Engine) -> None:
    job_id = submit(engine, "again")
    (first,) = reserve_batch(engine, [Reservation(job_id, on("n1", 0), False)], at=AT, lease_ttl_s=60.0)
    assert first is not None
    with engine.begin() as conn:  # its attempt ended and it was requeued (as `finish` does)
        conn.execute(leases.delete())
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="PENDING"))
    (second,) = reserve_batch(engine, [Reservation(job_id, on("n1", 0), False)], at=AT, lease_ttl_s=60.0)
    assert second is not None and second.number == 2 and second.fencing_token > first.fencing_token
    assert reserve_batch(engine, [], at=AT, lease_ttl_s=60.0) == []
    with pytest.raises(ValueError, match="batch must be at least 1 gang, got 0"):
        reserve_batch(engine, [Reservation(job_id, on("n1", 0), False)], at=AT, lease_ttl_s=60.0, batch=0)


def test_many_gangs_split_into_batches_each_all_or_nothing(engine: Engine) -> None:
    ids = [submit(engine, f"m{i}") for i in range(7)]
    wanted = [Reservation(job_id, on(f"n{i % 3}", i // 3), False) for i, job_id in enumerate(ids)]
    made = reserve_batch(engine, wanted, at=AT, lease_ttl_s=60.0, batch=3)
    assert all(a is not None for a in made)
    assert len(table(engine, select(leases))) == 7


def _wait_for_lock_wait(engine: Engine, application: str) -> None:
    """Return once the session named `application` waits for a row lock: a lock probe, no sleep."""
    probe = text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app AND wait_event_type = 'Lock'"
    )
    with engine.connect() as conn:
        for _ in range(100_000):
            waiting = conn.execute(probe, {"app": application}).scalar_one()
            conn.rollback()  # the statistics are a snapshot per transaction: take a fresh one
            if waiting:
                return
    raise AssertionError(f"{application} never waited for a lock")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("contended", ["job", "gpu"])
def test_a_batch_waits_for_a_concurrent_one_then_loses_only_the_gangs_it_conflicts_with(
    engine: Engine, contended: str
) -> None:
    """Another replica's batch is in flight: it holds job `taken` and GPU n1:0, uncommitted. Ours
    blocks on them (on the job's row lock, or on the lease row's key), and once the other commits,
    only our gangs on that GPU or of that job are refused; the rest of our batch is reserved."""
    racer, taken, on_gpu, free = (submit(engine, name) for name in ("racer", "taken", "on-gpu", "free"))
    ours = [Reservation(on_gpu, on("n1", 0, 1), False), Reservation(free, on("n3", 0), False)]
    if contended == "job":
        ours.append(Reservation(taken, on("n2", 0), False))
    url = engine.url.render_as_string(hide_password=False)
    mine = create_engine(url, connect_args={"application_name": "batch-ours"})
    result: list[Any] = []
    try:
        with engine.connect() as other:
            with other.begin():
                theirs = [Reservation(racer, on("n1", 0), False), Reservation(taken, on("n9", 0), False)]
                assert all(reserve_in(other, theirs, at=AT, lease_ttl_s=60.0))
                thread = threading.Thread(
                    target=lambda: result.extend(reserve_batch(mine, ours, at=AT, lease_ttl_s=60.0))
                )
                thread.start()
                _wait_for_lock_wait(engine, "batch-ours")
            thread.join()  # the other batch committed: ours goes on
    finally:
        mine.dispose()
    assert result[0] is None and result[1] is not None
    if contended == "job":
        assert result[2] is None  # `taken` was scheduled by the other batch meanwhile
    states = dict(table(engine, select(jobs.c.id, jobs.c.state)))
    assert (states[on_gpu], states[taken], states[free]) == ("PENDING", "SCHEDULED", "SCHEDULED")
    held = {(r.node, r.gpu_index) for r in table(engine, select(leases))}
    assert held == {("n1", 0), ("n9", 0), ("n3", 0)}


def test_move_jobs_refuses_a_job_not_in_the_expected_state_and_mixed_changes(engine: Engine) -> None:
    first, second = submit(engine, "m1"), submit(engine, "m2")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == second).values(state="CANCELLED"))
    moves = [JobMove(job, "r", None, {"attempt_count": 1}) for job in (first, second)]
    with pytest.raises(StaleState, match=second), engine.begin() as conn:
        move_jobs(conn, moves, JobState.PENDING, JobState.SCHEDULED, at=AT)
    assert dict(table(engine, select(jobs.c.id, jobs.c.state)))[first] == "PENDING"  # rolled back
    with pytest.raises(ValueError, match="changes"), engine.begin() as conn:
        move_jobs(conn, [moves[0], JobMove(second)], JobState.PENDING, JobState.SCHEDULED, at=AT)
