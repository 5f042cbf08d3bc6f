"""The state machines, and their guarded application in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import itertools

import pytest
from gpuyard.clock import utcnow
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import (
    ATTEMPT_TRANSITIONS,
    JOB_TRANSITIONS,
    TERMINAL_JOB_STATES,
    AttemptState,
    IllegalTransition,
    JobState,
    StaleState,
    check_attempt_transition,
    check_job_transition,
)
from gpuyard.store import jobs as job_store
from gpuyard.store.tables import attempts, events, jobs
from gpuyard.store.transitions import move_attempt, move_job
from sqlalchemy import Engine, insert, select

from .conftest import EXAMPLE_SPEC


@pytest.mark.parametrize(("current", "target"), itertools.product(JobState, JobState))
def test_job_edges_are_exactly_the_design(current: JobState, target: JobState) -> None:
    design = {
        (JobState.PENDING, JobState.SCHEDULED),
        (JobState.PENDING, JobState.CANCELLED),
        (JobState.PENDING, JobState.FAILED),
        (JobState.SCHEDULED, JobState.RUNNING),
        (JobState.SCHEDULED, JobState.PENDING),
        (JobState.SCHEDULED, JobState.FAILED),
        (JobState.SCHEDULED, JobState.CANCELLED),
        (JobState.RUNNING, JobState.SUCCEEDED),
        (JobState.RUNNING, JobState.FAILED),
        (JobState.RUNNING, JobState.CANCELLED),
        (JobState.RUNNING, JobState.PENDING),
    }
    if (current, target) in design:
        check_job_transition(current, target)
    else:
        with pytest.raises(IllegalTransition, match=f"from {current} to {target}"):
            check_job_transition(current, target)


def test_attempt_machine_ends_in_terminal_states() -> None:
    check_attempt_transition(AttemptState.RUNNING, AttemptState.PREEMPTED)
    with pytest.raises(IllegalTransition, match="terminal"):
        check_attempt_transition(AttemptState.LOST, AttemptState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_attempt_transition(AttemptState.CREATED, AttemptState.SUCCEEDED)
    assert all(not ATTEMPT_TRANSITIONS[s] for s in (AttemptState.SUCCEEDED, AttemptState.LOST))
    assert {s for s, nxt in JOB_TRANSITIONS.items() if not nxt} == TERMINAL_JOB_STATES


def _submit(engine: Engine) -> str:
    with engine.begin() as conn:
        from gpuyard.store import teams

        teams.ensure_team(conn, "a", teams.TeamQuota(), utcnow())
    job, _ = job_store.submit(
        engine, parse_spec(EXAMPLE_SPEC), idempotency_key=None, created_by="t", at=utcnow()
    )
    return job.id


def test_guarded_update_moves_and_records_an_event(engine: Engine) -> None:
    job_id = _submit(engine)
    with engine.begin() as conn:
        move_job(conn, job_id, JobState.PENDING, JobState.SCHEDULED, at=utcnow())
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar() == "SCHEDULED"
        types = conn.execute(select(events.c.type).where(events.c.job_id == job_id).order_by(events.c.seq))
        assert list(types.scalars()) == ["job.submitted", "job.scheduled"]


def test_a_stale_expectation_is_refused_and_changes_nothing(engine: Engine) -> None:
    job_id = _submit(engine)
    with engine.begin() as conn:
        move_job(conn, job_id, JobState.PENDING, JobState.CANCELLED, at=utcnow())
    with pytest.raises(StaleState, match="expected in PENDING but is CANCELLED"), engine.begin() as conn:
        move_job(conn, job_id, JobState.PENDING, JobState.SCHEDULED, at=utcnow())
    with pytest.raises(IllegalTransition), engine.begin() as conn:
        move_job(conn, job_id, JobState.CANCELLED, JobState.RUNNING, at=utcnow())
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar() == "CANCELLED"
        assert conn.execute(select(events.c.type).where(events.c.job_id == job_id)).scalars().all() == [
            "job.submitted",
            "job.cancelled",
        ]


def test_attempt_transitions_are_guarded(engine: Engine) -> None:
    job_id = _submit(engine)
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(
            insert(attempts).values(
                id="att-1",
                job_id=job_id,
                number=1,
                state="CREATED",
                fencing_token=1,
                placement={},
                created_at=now,
                updated_at=now,
            )
        )
        assert move_attempt(conn, "att-1", AttemptState.CREATED, AttemptState.LAUNCHING, at=now) == job_id
    with pytest.raises(StaleState, match="att-1"), engine.begin() as conn:
        move_attempt(conn, "att-1", AttemptState.CREATED, AttemptState.LAUNCHING, at=now)
    with pytest.raises(StaleState, match="missing"), engine.begin() as conn:
        move_attempt(conn, "att-404", AttemptState.CREATED, AttemptState.LAUNCHING, at=now)
