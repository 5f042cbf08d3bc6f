"""Jobs: submission with idempotency, reads with cursor pagination, cancellation."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from gpuyard.domain.model import Attempt, Event, Job
from gpuyard.domain.spec import JobSpec
from gpuyard.domain.states import TERMINAL_JOB_STATES, AttemptState, JobState
from gpuyard.store.outbox import append_event, job_events
from gpuyard.store.specs import SpecCache
from gpuyard.store.tables import attempts, jobs
from gpuyard.store.transitions import move_job


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different JobSpec."""

    def __init__(self, key: str, job_id: str):
        self.key, self.job_id = key, job_id
        super().__init__(f"Idempotency-Key {key!r} was already used for job {job_id} with a different body")


class NotCancellable(Exception):
    def __init__(self, job: Job):
        self.job = job
        super().__init__(f"job {job.id} is already {job.state.value}")


@dataclass(frozen=True)
class JobDetail:
    job: Job
    attempts: list[Attempt]
    events: list[Event]


MAX_SEQ = 2**63 - 1  # jobs.seq is a BIGINT


def new_job_id() -> str:
    return f"job-{secrets.token_hex(8)}"


# Built once: the idempotent insert, per dialect (both speak ON CONFLICT ... DO NOTHING RETURNING).
_INSERT_JOB = {
    dialect.__name__.rsplit(".", 1)[-1]: dialect.insert(jobs)
    .on_conflict_do_nothing(index_elements=["team", "idempotency_key"])
    .returning(jobs.c.seq)
    for dialect in (postgresql, sqlite)
}


def new_job_row(
    spec: JobSpec, *, idempotency_key: str | None, created_by: str, at: datetime
) -> dict[str, Any]:
    """The `jobs` row of a new submission (every submit path writes exactly this)."""
    return {
        "id": new_job_id(),
        "team": spec.team,
        "name": spec.name,
        "spec": spec.model_dump(mode="json"),
        "spec_hash": spec.fingerprint(),
        "idempotency_key": idempotency_key,
        "state": JobState.PENDING.value,
        "priority": spec.priority_value,
        "gpus": spec.resources.gpus,  # the size it is launched at (an elastic job's min)
        "created_by": created_by,
        "created_at": at,
        "updated_at": at,
    }


def submitted_event_data(spec: JobSpec) -> dict[str, Any]:
    return {"team": spec.team, "gpus": spec.resources.gpus, "priority": spec.priority}


def submit(
    engine: Engine, spec: JobSpec, *, idempotency_key: str | None, created_by: str, at: datetime
) -> tuple[Job, bool]:
    """Store the job and its `job.submitted` event in ONE transaction. Returns (job, created)."""
    row = new_job_row(spec, idempotency_key=idempotency_key, created_by=created_by, at=at)
    with engine.begin() as conn:
        if conn.execute(_INSERT_JOB[conn.dialect.name], row).first() is None:  # the key was used before
            return _replay(conn, spec, str(idempotency_key)), False
        append_event(conn, type="job.submitted", job_id=row["id"], at=at, data=submitted_event_data(spec))
    return job_from_mapping(row, spec), True


def replay(engine: Engine, spec: JobSpec, idempotency_key: str) -> tuple[Job, bool]:
    """The job this key made before, or IdempotencyConflict if it was made from a different body."""
    with engine.connect() as conn:
        return _replay(conn, spec, idempotency_key), False


def _replay(conn: Connection, spec: JobSpec, idempotency_key: str) -> Job:
    existing = conn.execute(
        select(jobs).where(jobs.c.team == spec.team, jobs.c.idempotency_key == idempotency_key)
    ).one()
    if existing.spec_hash != spec.fingerprint():
        raise IdempotencyConflict(idempotency_key, existing.id)
    return job_from_row(existing)


def get(conn: Connection, job_id: str, *, lock: bool = False) -> Job | None:
    """The job; with `lock`, its row is locked until the transaction ends (the store's lock order:
    a job, then its attempts, then their leases; docs/concepts.md)."""
    query = select(jobs).where(jobs.c.id == job_id)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return job_from_row(row) if row else None


def detail(engine: Engine, job_id: str) -> JobDetail | None:
    with engine.connect() as conn:
        job = get(conn, job_id)
        if job is None:
            return None
        rows = conn.execute(select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.number))
        return JobDetail(
            job=job, attempts=[attempt_from_row(r) for r in rows], events=job_events(conn, job_id)
        )


def page(
    engine: Engine,
    *,
    teams: list[str] | None,
    state: JobState | None,
    limit: int,
    after_seq: int | None,
) -> tuple[list[Job], int | None]:
    """Newest first. `teams=None` means every team. Returns the jobs and the cursor of the next page."""
    query = select(jobs).order_by(jobs.c.seq.desc()).limit(limit + 1)
    if teams is not None:
        query = query.where(jobs.c.team.in_(teams))
    if state is not None:
        query = query.where(jobs.c.state == state.value)
    if after_seq is not None:
        # Bounded like the column (BIGINT): a larger cursor lies past every job, as MAX_SEQ does.
        query = query.where(jobs.c.seq < min(after_seq, MAX_SEQ))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return [job_from_row(r) for r in rows], (rows[-1].seq if more else None)


@dataclass(frozen=True)
class QueuedRow:
    """A pending job as the queue lists it: the columns only, never the spec (cheap at 10,000 rows)."""

    id: str
    team: str
    name: str
    priority: int
    gpus: int
    attempt_count: int
    created_at: datetime
    updated_at: datetime
    not_before: datetime | None
    cancel_requested: bool


def queued(conn: Connection, teams: list[str] | None) -> list[QueuedRow]:
    """Every PENDING job (of `teams`; None: all), in queue order: priority first, then oldest."""
    columns = [getattr(jobs.c, name) for name in QueuedRow.__dataclass_fields__]
    query = select(*columns).where(jobs.c.state == JobState.PENDING.value)
    if teams is not None:
        query = query.where(jobs.c.team.in_(teams))
    rows = conn.execute(query.order_by(jobs.c.priority.desc(), jobs.c.seq))
    return [QueuedRow(*row) for row in rows]


def count_by_state(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state))
        return {state: count for state, count in rows}


def cancel(engine: Engine, job_id: str, *, at: datetime, by: str) -> Job:
    """A pending job is cancelled at once; a placed one is marked, and its attempt is stopped by its owner.

    The job's row is locked first, so a concurrent end of its attempt (which locks it too) either
    sees the mark, or has already put the job back to PENDING, where the cancel takes effect at once."""
    with engine.begin() as conn:
        job = get(conn, job_id, lock=True)
        if job is None:
            raise KeyError(job_id)
        if job.state in TERMINAL_JOB_STATES:
            raise NotCancellable(job)
        if job.state == JobState.PENDING:
            move_job(conn, job_id, JobState.PENDING, JobState.CANCELLED, at=at, reason=f"cancelled by {by}")
        elif not job.cancel_requested:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == job.state.value)
                .values(cancel_requested=True, updated_at=at)
            )
            append_event(conn, type="job.cancel_requested", job_id=job_id, at=at, data={"by": by})
        return get(conn, job_id)  # type: ignore[return-value]


def job_from_mapping(row: dict[str, Any], spec: JobSpec) -> Job:
    return Job(
        id=row["id"],
        team=row["team"],
        name=row["name"],
        spec=spec,
        state=JobState(row["state"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        created_by=row["created_by"],
        failures=row.get("failures", 0),
        attempt_count=row.get("attempt_count", 0),
        cancel_requested=row.get("cancel_requested", False),
        reason=row.get("reason"),
        not_before=row.get("not_before"),
        attained_gpu_s=row.get("attained_gpu_s") or 0.0,
        progress_lost_gpu_s=row.get("progress_lost_gpu_s") or 0.0,
        checkpoint_url=row.get("checkpoint_url"),
        checkpoint_step=row.get("checkpoint_step"),
        checkpoint_site=row.get("checkpoint_site"),
        checkpoint_cost_s=row.get("checkpoint_cost_s"),
        checkpoint_bytes=row.get("checkpoint_bytes"),
        first_started_at=row.get("first_started_at"),
    )


def job_from_row(row: Any, *, prefix: str = "", specs: SpecCache | None = None) -> Job:
    """The Job of a `jobs` row; with `prefix`, of the columns labelled `<prefix><name>` in a join. Its
    spec is validated here, or taken from `specs`, the cache of a reader that reads it again and again."""
    mapping = {name[len(prefix) :]: value for name, value in row._mapping.items() if name.startswith(prefix)}
    if specs is None:
        return job_from_mapping(mapping, JobSpec.model_validate(mapping["spec"]))
    return job_from_mapping(mapping, specs.get(mapping["id"], mapping["spec_hash"], mapping["spec"]))


def attempt_from_row(row: Any) -> Attempt:
    return Attempt(
        id=row.id,
        job_id=row.job_id,
        number=row.number,
        state=AttemptState(row.state),
        fencing_token=row.fencing_token,
        placement=row.placement,
        created_at=row.created_at,
        updated_at=row.updated_at,
        exit_code=row.exit_code,
        reason=row.reason,
        step=row.step,
        checkpoint_url=row.checkpoint_url,
        checkpoint_step=row.checkpoint_step,
        checkpoint_at=row.checkpoint_at,
        stop_requested=row.stop_requested,
        borrowed=row.borrowed,
        started_at=row.started_at,
        ended_at=row.ended_at,
        heartbeat_at=row.heartbeat_at,
        progress_lost_s=row.progress_lost_s,
        lease_expires_at=row.lease_expires_at,
        progress_at=row.progress_at,
        resume_step=row.resume_step,
        restore_s=row.restore_s,
        checkpoint_stall_s=row.checkpoint_stall_s,
        new_step_at=row.new_step_at,
        step_s=row.step_s,
        local_batch=row.local_batch,
        accum_steps=row.accum_steps,
        global_batch=row.global_batch,
        attempt_secret=row.attempt_secret,
    )
