"""Races in the store on PostgreSQL, each forced by pausing one transaction at a chosen statement and
probing that the other waits on its lock (no sleeps): the store's one lock order (job, attempt,
leases) makes the second writer queue up and then see what the first did.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import AttemptState
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from gpuyard.store.reservations import Reservation, reserve_batch
from servers import wait_until
from sqlalchemy import Engine, event, text
from stores import empty_store

from .conftest import EXAMPLE_SPEC

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(postgres_url: str, _postgres_engine: Engine) -> Iterator[Engine]:
    empty_store(_postgres_engine)
    engine = make_engine(postgres_url, pool_size=8)
    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", TeamQuota(), utcnow())
    yield engine
    engine.dispose()


class Pause:
    """Holds the transaction of `engine` right after its first statement matching `pattern` ran."""

    def __init__(self, engine: Engine, pattern: str):
        self.reached, self.go = threading.Event(), threading.Event()
        self.engine, self.pattern = engine, re.compile(pattern)
        event.listen(engine, "after_cursor_execute", self._hook)

    def _hook(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if self.pattern.search(statement) and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(20), "the test never released the paused transaction"

    def release(self) -> None:
        self.go.set()  # the hook stays (it pauses once); the engine is thrown away after the test


def waits_on_a_lock(engine: Engine) -> bool:
    """Some backend of this database is blocked by another's lock (the lock probe)."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND cardinality(pg_blocking_pids(pid)) > 0"
                )
            ).scalar()
        )


def interleave(
    engine: Engine, first: Callable[[Engine], Any], pattern: str, second: Callable[[Engine], Any]
) -> tuple[Any, Any]:
    """Run `first` until its statement matching `pattern`, then `second`, which must block on a lock;
    then let `first` finish, then `second`. Returns both results (or raises their errors)."""
    paused = make_engine(str(engine.url.render_as_string(hide_password=False)), pool_size=2)
    pause = Pause(paused, pattern)
    with ThreadPoolExecutor(2) as pool:
        one: Future[Any] = pool.submit(first, paused)
        wait_until(pause.reached.is_set, what=f"the first transaction to reach {pattern!r}")
        two: Future[Any] = pool.submit(second, engine)
        wait_until(lambda: waits_on_a_lock(engine), what="the second transaction to wait on the lock")
        pause.release()
        results = one.result(timeout=20), two.result(timeout=20)
    paused.dispose()
    return results


def running_attempt(engine: Engine, **changes: Any) -> attempt_store.Attempt:
    spec = parse_spec({**EXAMPLE_SPEC, "resources": {"gpus": 2, "gpu_types": ["cpu"]}, **changes})
    job, _ = job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=utcnow())
    placement = Placement("local", "local", "local", (NodeSlice(f"node-{job.id}", (0, 1)),))
    (attempt,) = reserve_batch(engine, [Reservation(job.id, placement, False)], at=utcnow(), lease_ttl_s=60)
    assert attempt is not None
    attempt_store.mark_running(engine, attempt.id, utcnow())
    return attempt


def job_state(engine: Engine, job_id: str) -> tuple[str, bool]:
    with engine.connect() as conn:
        job = job_store.get(conn, job_id)
    assert job is not None
    return job.state.value, job.cancel_requested


def lose(attempt: attempt_store.Attempt) -> Callable[[Engine], bool]:
    def lost(engine: Engine) -> bool:
        with engine.begin() as conn:
            return attempt_store.finish(
                conn, attempt.id, AttemptState.LOST, at=utcnow(), reason="node lost", disrupted=True
            )

    return lost


def cancel(attempt: attempt_store.Attempt) -> Callable[[Engine], Any]:
    return lambda engine: job_store.cancel(engine, attempt.job_id, at=utcnow(), by="t")


def test_a_cancel_while_the_attempt_ends_and_requeues_cancels_the_job(engine: Engine) -> None:
    """The review's lost cancel: the attempt's end put the job back to PENDING while the cancel marked
    it from a stale read, leaving a PENDING job with the flag, skipped forever."""
    attempt = running_attempt(engine)
    interleave(engine, lose(attempt), r"^UPDATE attempts SET state", cancel(attempt))
    assert job_state(engine, attempt.job_id) == ("CANCELLED", False)


def test_an_attempt_ending_while_its_job_is_being_cancelled_cancels_the_job(engine: Engine) -> None:
    attempt = running_attempt(engine)
    interleave(engine, cancel(attempt), r"^UPDATE jobs SET cancel_requested", lose(attempt))
    assert job_state(engine, attempt.job_id)[0] == "CANCELLED"


def beat(attempt: attempt_store.Attempt, step: int = 5) -> Callable[[Engine], attempt_store.Beat]:
    return lambda engine: attempt_store.heartbeat(
        engine,
        attempt.id,
        attempt.fencing_token,
        secret=attempt.attempt_secret or "",
        step=step,
        checkpoint=None,
        at=utcnow(),
        lease_ttl_s=60,
    )


def test_a_heartbeat_during_the_launchers_running_report_is_answered_not_refused(engine: Engine) -> None:
    """The review's healthy worker that killed itself: its first heartbeat read CREATED while the
    launcher moved the attempt on, failed the transition, and got 409 (a stale token to the worker)."""
    spec = parse_spec({**EXAMPLE_SPEC, "resources": {"gpus": 1, "gpu_types": ["cpu"]}})
    job, _ = job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=utcnow())
    placement = Placement("local", "local", "local", (NodeSlice("n", (0,)),))
    (attempt,) = reserve_batch(engine, [Reservation(job.id, placement, False)], at=utcnow(), lease_ttl_s=60)
    assert attempt is not None
    _, answer = interleave(
        engine,
        lambda e: attempt_store.mark_running(e, attempt.id, utcnow()),
        r"^UPDATE attempts SET state",
        beat(attempt),
    )
    assert answer.action == "continue" and answer.attempt.state == AttemptState.RUNNING


def test_a_heartbeat_and_the_end_of_its_attempt_queue_up_instead_of_deadlocking(engine: Engine) -> None:
    """Heartbeats locked leases then the attempt, the end of an attempt the attempt then its leases:
    a PostgreSQL deadlock. Both lock the job first now; the beat that comes second finds it ended."""
    attempt = running_attempt(engine)
    interleave(engine, beat(attempt), r"^UPDATE leases SET expires_at", lose(attempt))
    attempt = running_attempt(engine)
    ended, refused = interleave(
        engine, lose(attempt), r"^DELETE FROM leases", lambda e: _refused(lambda: beat(attempt)(e))
    )
    assert ended is True and refused


def _refused(call: Callable[[], Any]) -> bool:
    try:
        call()
    except attempt_store.Unproven:  # the attempt ended, its secret with it
        return True
    return False


def test_concurrent_writers_of_the_same_attempts_never_deadlock(engine: Engine) -> None:
    """Heartbeats, launcher renewals, stop requests, cancels, reports and ends of a few attempts from
    eight threads at once: every call either applies or is refused by its guard, none deadlocks."""
    attempts = [running_attempt(engine) for _ in range(4)]
    rng = random.Random(20261201)
    operations: list[Callable[[], Any]] = []
    for _ in range(400):
        target = rng.choice(attempts)
        operations.append(
            rng.choice(
                [
                    lambda a=target: beat(a, rng.randrange(100))(engine),
                    lambda a=target: attempt_store.renew(
                        engine, {x.id: x.fencing_token for x in attempts}, at=utcnow(), lease_ttl_s=60
                    ),
                    lambda a=target: attempt_store.request_stop(engine, a.id, at=utcnow(), why="evict"),
                    lambda a=target: attempt_store.mark_running(engine, a.id, utcnow()),
                    lambda a=target: _refused(lambda: cancel(a)(engine)),
                    lambda a=target: lose(a)(engine) if rng.random() < 0.05 else None,
                ]
            )
        )
    failures: list[BaseException] = []

    def run(call: Callable[[], Any]) -> None:
        try:
            call()
        except (attempt_store.Unproven, job_store.NotCancellable):
            pass  # a guard refused it: the attempt or the job had ended
        except BaseException as error:
            failures.append(error)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, operations))
    assert failures == []
