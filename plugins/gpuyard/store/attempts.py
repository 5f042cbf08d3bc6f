"""Attempts and leases once reserved: heartbeats and launcher renewals, checkpoint records, the end
of an attempt, and expiry. Reserving (attempt + one lease per GPU + fencing token) is
`store/reservations.py`'s, the one path the scheduler and the tests take.

Lock order, the same in every transaction (docs/concepts.md): the job's row, then its attempt's
row, then the attempt's lease rows (then the fencing counter). A function that changes an attempt
locks its job first (`_locked`), so two writers of one job queue up instead of deadlocking, and
each re-reads under the lock the state it guards on.

Every `at`/`now` given here is the database's time (store/dbclock.py) in production, so leases are
written and reaped with one clock whatever the skew of the processes' own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select, tuple_, update

from gpuyard.domain.attempt_secret import proves
from gpuyard.domain.checkpoint_roots import CheckpointStores, is_under, job_roots, roots_for
from gpuyard.domain.model import Attempt, Job
from gpuyard.domain.retry import LOSS_WINDOW_S, after_attempt, attribute
from gpuyard.domain.states import (
    TERMINAL_ATTEMPT_STATES,
    AttemptState,
    JobState,
    StopReason,
)
from gpuyard.platform_metrics import AttemptRecord, JobRecord
from gpuyard.store import interruptions
from gpuyard.store.jobs import attempt_from_row, get, job_from_row
from gpuyard.store.leadership import Lead, fenced
from gpuyard.store.outbox import append_event
from gpuyard.store.specs import SpecCache
from gpuyard.store.tables import attempts, jobs, leases
from gpuyard.store.teams import configured_checkpoint_roots
from gpuyard.store.transitions import move_attempt, move_job

LIVE_STATES = (AttemptState.CREATED, AttemptState.LAUNCHING, AttemptState.RUNNING)
LIVE = tuple(state.value for state in LIVE_STATES)


class Unproven(Exception):
    """The heartbeat did not prove its attempt: no such attempt, it has ended, or the secret offered
    is not its own. One refusal for all three, so a caller learns nothing about ids it guesses."""


class StaleToken(Exception):
    """The attempt's own secret came with a fencing token that is not the attempt's: stop."""


class CheckpointRefused(ValueError):
    """A heartbeat named a checkpoint outside the job's own checkpoint roots."""


@dataclass(frozen=True)
class LiveAttempt:
    attempt: Attempt
    job: Job


@dataclass(frozen=True)
class Beat:
    lease_expires_at: datetime
    action: str  # continue | checkpoint_and_stop
    job: Job
    attempt: Attempt


_JOB = "job__"  # the prefix of the job's columns where attempts are read joined with their jobs
_JOB_COLUMNS = [column.label(f"{_JOB}{column.name}") for column in jobs.c]


def live(conn: Connection, specs: SpecCache | None = None) -> list[LiveAttempt]:
    """Every live attempt with its job, oldest first, in one query (the jobs' specs from `specs`)."""
    rows = conn.execute(
        select(attempts, *_JOB_COLUMNS)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.state.in_(LIVE))
        .order_by(attempts.c.created_at)
    ).all()
    return [
        LiveAttempt(attempt=attempt_from_row(row), job=job_from_row(row, prefix=_JOB, specs=specs))
        for row in rows
    ]


def asked_to_stop(conn: Connection) -> set[str]:
    """The live attempts asked to stop (by the cycle, a cancel, a limit or an admin)."""
    return set(
        conn.execute(
            select(attempts.c.id).where(attempts.c.state.in_(LIVE), attempts.c.stop_requested.is_not(None))
        ).scalars()
    )


def attempt(conn: Connection, attempt_id: str, *, lock: bool = False) -> Attempt | None:
    query = select(attempts).where(attempts.c.id == attempt_id)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return attempt_from_row(row) if row else None


def _locked(conn: Connection, attempt_id: str) -> tuple[Job, Attempt] | None:
    """The attempt and its job, both locked in the store's lock order (job first)."""
    job_id = conn.execute(select(attempts.c.job_id).where(attempts.c.id == attempt_id)).scalar()
    if job_id is None:
        return None
    job = get(conn, job_id, lock=True)
    found = attempt(conn, attempt_id, lock=True)
    assert job is not None and found is not None
    return job, found


def _extend_lease(conn: Connection, attempt_id: str, token: int, expires: datetime) -> bool:
    """Move the attempt's lease (and its GPU leases) to `expires`, never backwards. False when the
    attempt is not live with this token any more. Lock order: the attempt row, then its leases."""
    renewed = conn.execute(
        update(attempts)
        .where(
            attempts.c.id == attempt_id,
            attempts.c.fencing_token == token,
            attempts.c.state.in_(LIVE),
            (attempts.c.lease_expires_at.is_(None)) | (attempts.c.lease_expires_at < expires),
        )
        .values(lease_expires_at=expires)
    )
    if renewed.rowcount:
        conn.execute(
            update(leases)
            .where(leases.c.attempt_id == attempt_id, leases.c.fencing_token == token)
            .values(expires_at=expires)
        )
    return bool(renewed.rowcount)


@contextmanager
def batch(
    engine: Engine, attempt_ids: Sequence[str], *, lead: Lead | None = None, now: datetime
) -> Iterator[Connection]:
    """One transaction for changes to many attempts, their jobs locked up front in id order: each
    attempt's own change (which locks its job, then itself) may then follow in any order without
    deadlocking a writer of one of them. One commit for a batch instead of one per attempt. With
    `lead`, only under that lead (`leadership.fenced`)."""
    with fenced(engine, lead, now=now) as conn:
        job_ids = conn.execute(select(attempts.c.job_id).where(attempts.c.id.in_(attempt_ids))).scalars()
        conn.execute(
            select(jobs.c.id).where(jobs.c.id.in_(sorted(set(job_ids)))).order_by(jobs.c.id).with_for_update()
        ).all()
        yield conn


def claim_launch(conn: Connection, attempt_id: str, at: datetime, lease_ttl_s: float) -> bool:
    """CREATED -> LAUNCHING, in the caller's (fenced) transaction, before the launcher starts anything
    of the attempt: the one claim on launching it. False when it is not CREATED any more (another
    replica claimed it, or it ended: a cancel, a reap) or its reservation's lease ran out (the reaper
    ends it as LOST, and a launch now would run beside its successor): nothing may be started for it.
    The claim renews the lease: until the launcher's first renewal, the launch is the attempt's sign
    of life (a new leader that launches a reservation near its lease's end, a worker that exits before
    any renewal: neither is reaped as lost while it runs or after it succeeded)."""
    locked = _locked(conn, attempt_id)
    if locked is None or locked[1].state != AttemptState.CREATED:
        return False
    found = locked[1]
    if found.lease_expires_at is not None and found.lease_expires_at < at:
        return False
    move_attempt(conn, attempt_id, AttemptState.CREATED, AttemptState.LAUNCHING, at=at)
    _extend_lease(conn, attempt_id, found.fencing_token, at + timedelta(seconds=lease_ttl_s))
    return True


def _mark_running(conn: Connection, job: Job, found: Attempt, at: datetime) -> None:
    """CREATED/LAUNCHING -> RUNNING, and the job SCHEDULED -> RUNNING. The caller holds both locks."""
    if found.state == AttemptState.CREATED:
        move_attempt(conn, found.id, AttemptState.CREATED, AttemptState.LAUNCHING, at=at)
    if found.state in (AttemptState.CREATED, AttemptState.LAUNCHING):
        move_attempt(
            conn,
            found.id,
            AttemptState.LAUNCHING,
            AttemptState.RUNNING,
            at=at,
            changes={"started_at": at, "progress_at": at},
        )
        if job.state == JobState.SCHEDULED:
            first = {} if job.first_started_at else {"first_started_at": at}
            move_job(
                conn, job.id, JobState.SCHEDULED, JobState.RUNNING, at=at, attempt_id=found.id, changes=first
            )


def mark_running(engine: Engine, attempt_id: str, at: datetime) -> None:
    """The workers run (reported by the launcher or by a first heartbeat). Idempotent."""
    with engine.begin() as conn:
        mark_running_in(conn, attempt_id, at)


def mark_running_in(conn: Connection, attempt_id: str, at: datetime) -> None:
    """`mark_running` in the caller's transaction (a `batch` of reports)."""
    locked = _locked(conn, attempt_id)
    if locked is not None and locked[1].state not in TERMINAL_ATTEMPT_STATES:
        _mark_running(conn, *locked, at)


def renew(
    engine: Engine,
    tokens: Mapping[str, int],
    *,
    at: datetime,
    lease_ttl_s: float,
    lead: Lead | None = None,
    running: bool = True,
) -> set[str]:
    """The launcher's renewal: it sees these attempts' workers alive (or, not `running`, starting).
    Renews the lease of each that is still live with the given fencing token (a launcher renews only
    the attempt it launched), marks it RUNNING if it was not yet and `running`, and returns the ids
    renewed. With `lead`, only under that lead."""
    if not tokens:
        return set()
    expires = at + timedelta(seconds=lease_ttl_s)
    with fenced(engine, lead, now=at) as conn:
        rows = conn.execute(
            select(attempts.c.id, attempts.c.job_id, attempts.c.state).where(
                tuple_(attempts.c.id, attempts.c.fencing_token).in_(list(tokens.items())),
                attempts.c.state.in_(LIVE),
            )
        ).all()
        starting = {row.id: row.job_id for row in rows if running and row.state != AttemptState.RUNNING.value}
        for job_id in sorted(set(starting.values())):
            get(conn, job_id, lock=True)  # the lock order: these jobs before their attempts
        locked = conn.execute(
            select(attempts.c.id)
            .where(attempts.c.id.in_([row.id for row in rows]))
            .order_by(attempts.c.id)
            .with_for_update()
        ).scalars()
        renewed = {
            attempt_id
            for attempt_id in locked
            if _extend_lease(conn, attempt_id, tokens[attempt_id], expires)
        }
        for attempt_id, job_id in starting.items():
            found, job = attempt(conn, attempt_id), get(conn, job_id)
            if attempt_id in renewed and found is not None and job is not None:
                _mark_running(conn, job, found, at)
        return renewed


def _checkpoint_allowed(conn: Connection, job: Job, url: str, stores: CheckpointStores) -> bool:
    """A worker may record only checkpoints under its job's own roots (`checkpoint_roots.job_roots`):
    its spec's URL, or its folder under its team's roots (where cross-site moves put them)."""
    team = roots_for(job.spec, configured_checkpoint_roots(conn, job.team), stores)
    return any(is_under(url, root) for root in job_roots(job.id, job.spec, team))


def heartbeat(
    engine: Engine,
    attempt_id: str,
    token: int,
    *,
    secret: str,
    step: int | None,
    checkpoint: dict[str, Any] | None,
    at: datetime,
    lease_ttl_s: float,
    stores: CheckpointStores = CheckpointStores(),
    restore: dict[str, Any] | None = None,
    checkpoint_stall_s: float | None = None,
    throughput: dict[str, Any] | None = None,
) -> Beat:
    """Renew the attempt's leases and record progress, only for a worker that proves the live attempt
    with its `secret` (Unproven) and holds its fencing token (StaleToken).

    What the accounting reads (docs/metrics.md): `restore` ({step, seconds}: the checkpoint its
    workers restored and how long that took), `checkpoint_stall_s` (all the seconds its steps paused
    for checkpoint writes so far), and the first beat with a step past the one it resumed from.
    What an elastic sizing reads: `throughput` ({step_s, local_batch, accum_steps, global_batch}: its
    workers' newest measure of their steps), kept as the newest beat carried it.

    Locks the job, then the attempt (the store's lock order), so a concurrent transition of either
    waits for this beat or is seen by it: a live attempt's own worker is never refused, and an ending
    (which clears the secret) is never overwritten by a beat."""
    with engine.begin() as conn:
        locked = _locked(conn, attempt_id)
        if (
            locked is None
            or locked[1].state in TERMINAL_ATTEMPT_STATES
            or not proves(locked[1].attempt_secret, secret)
        ):
            raise Unproven(f"attempt {attempt_id}: unknown, ended, or not this attempt's secret")
        job, found = locked
        if found.fencing_token != token:
            raise StaleToken(f"attempt {attempt_id}: fencing token {token} is not the attempt's")
        if checkpoint and not _checkpoint_allowed(conn, job, checkpoint["url"], stores):
            raise CheckpointRefused(
                f"checkpoint.url: {checkpoint['url']!r} is outside job {job.id}'s checkpoint roots (its "
                f"checkpoint.url, or its folder under team {job.team}'s roots)"
            )
        expires = at + timedelta(seconds=lease_ttl_s)
        _extend_lease(conn, attempt_id, token, expires)
        _mark_running(conn, job, found, at)
        changes: dict[str, Any] = {"heartbeat_at": at}
        resume_step = found.resume_step
        if restore is not None:
            resume_step = restore["step"]
            changes |= {"resume_step": resume_step, "restore_s": float(restore["seconds"])}
        if throughput is not None:
            changes |= {k: throughput[k] for k in ("step_s", "local_batch", "accum_steps", "global_batch")}
        if checkpoint_stall_s is not None:
            # Beats may be answered out of order (retries): the worker's total only grows.
            changes["checkpoint_stall_s"] = max(checkpoint_stall_s, found.checkpoint_stall_s or 0.0)
        if step is not None:
            changes["step"] = step
            if found.step is None or step > found.step:
                changes["progress_at"] = at
            if found.new_step_at is None and step > (resume_step or 0):
                changes["new_step_at"] = at
        # Only a newer step is recorded: a worker repeats its newest checkpoint in every beat until one
        # is answered, and a repeat must not move `checkpoint_at` (the lost progress counts from it).
        if checkpoint and (found.checkpoint_step is None or checkpoint["step"] > found.checkpoint_step):
            changes |= {
                "checkpoint_url": checkpoint["url"],
                "checkpoint_step": checkpoint["step"],
                "checkpoint_at": checkpoint.get("saved_at") or at,
            }
            job_changes: dict[str, Any] = {
                "checkpoint_url": checkpoint["url"],
                "checkpoint_step": checkpoint["step"],
                "checkpoint_site": found.placement.get("site"),
                "checkpoint_bytes": checkpoint.get("bytes"),  # a move's estimate reads it
            }
            if checkpoint.get("cost_s"):
                job_changes["checkpoint_cost_s"] = float(checkpoint["cost_s"])
            conn.execute(update(jobs).where(jobs.c.id == found.job_id).values(**job_changes))
            append_event(
                conn,
                type="attempt.checkpointed",
                job_id=found.job_id,
                attempt_id=attempt_id,
                at=at,
                data={"step": checkpoint["step"], "url": checkpoint["url"]},
            )
        conn.execute(update(attempts).where(attempts.c.id == attempt_id).values(**changes))
        job = get(conn, found.job_id)
        fresh = attempt(conn, attempt_id)
        assert job is not None and fresh is not None
        stop = fresh.stop_requested is not None or job.cancel_requested
        return Beat(expires, "checkpoint_and_stop" if stop else "continue", job, fresh)


def request_stop(
    engine: Engine,
    attempt_id: str,
    *,
    at: datetime,
    why: str,
    kind: StopReason = StopReason.PREEMPT,
    lead: Lead | None = None,
) -> bool:
    """Ask a live attempt to checkpoint and stop (its next heartbeat answer says so, and the scheduler
    signals its workers). The first reason asked wins; False if it was asked before or has ended.
    With `lead` (the scheduler's stops and evictions), only under that lead."""
    with fenced(engine, lead, now=at) as conn:
        locked = _locked(conn, attempt_id)
        if locked is None or locked[1].state not in LIVE_STATES or locked[1].stop_requested is not None:
            return False
        conn.execute(
            update(attempts)
            .where(attempts.c.id == attempt_id)
            .values(stop_requested=kind.value, updated_at=at)
        )
        append_event(
            conn,
            type="attempt.stop_requested",
            job_id=locked[0].id,
            attempt_id=attempt_id,
            at=at,
            data={"why": why, "kind": kind.value},
        )
        return True


def finish(
    conn: Connection,
    attempt_id: str,
    outcome: AttemptState,
    *,
    at: datetime,
    exit_code: int | None = None,
    reason: str | None = None,
    disrupted: bool = False,
) -> bool:
    """End the attempt, free its leases, and move its job as the retry policy says, in the caller's
    transaction (the scheduler's is fenced by its lead). Idempotent: returns False when the attempt
    had already ended.

    `disrupted`: the launcher saw the platform stop or lose the workers (its own signal, an eviction,
    a node gone). With the attempt's `stop_requested`, it decides whether a preemption or loss is
    not the job's fault (domain/retry.attribute)."""
    locked = _locked(conn, attempt_id)
    if locked is None or locked[1].state in TERMINAL_ATTEMPT_STATES:
        return False
    job, found = locked
    stop = StopReason.read(found.stop_requested)
    outcome, reason = attribute(outcome, exit_code, reason, stop=stop, disrupted=disrupted)
    if outcome == AttemptState.SUCCEEDED and found.state != AttemptState.RUNNING:
        # It ran and ended between two observations: record the RUNNING it went through.
        _mark_running(conn, job, found, at)
        job, found = get(conn, job.id), attempt(conn, attempt_id)  # type: ignore[assignment]
        assert job is not None and found is not None
    gpus = sum(len(n["gpus"]) for n in found.placement.get("nodes", []))
    started = found.started_at
    ran_s = (at - started).total_seconds() if started else 0.0
    saved_until = max(filter(None, [started, found.checkpoint_at]), default=None)
    lost_s = 0.0
    if outcome in (AttemptState.LOST, AttemptState.PREEMPTED) and saved_until is not None:
        lost_s = max(0.0, (at - saved_until).total_seconds())
    move_attempt(
        conn,
        attempt_id,
        found.state,
        outcome,
        at=at,
        reason=reason,
        changes={
            "exit_code": exit_code,
            "ended_at": at,
            "progress_lost_s": lost_s,
        },
    )
    conn.execute(delete(leases).where(leases.c.attempt_id == attempt_id))
    if started is not None:  # it ran on its nodes: their interruption records learn from it
        nodes = [n["node"] for n in found.placement.get("nodes", [])]
        interruptions.record_ended(conn, nodes, ran_s=ran_s, lost=outcome == AttemptState.LOST, at=at)
    decision = after_attempt(
        job.spec.retry,
        outcome,
        job.failures,
        exit_code,
        reason,
        cancel_requested=job.cancel_requested or stop == StopReason.CANCEL,
        stop=stop,
        earlier_losses_s=_earlier_losses_s(conn, job.id, attempt_id, at)
        if outcome == AttemptState.LOST
        else (),
    )
    changes: dict[str, Any] = {
        "failures": decision.failures,
        "attained_gpu_s": jobs.c.attained_gpu_s + ran_s * gpus,
        "progress_lost_gpu_s": jobs.c.progress_lost_gpu_s + lost_s * gpus,
    }
    if decision.backoff_s:
        changes["not_before"] = at + timedelta(seconds=decision.backoff_s)
    if job.state != decision.job_state:
        move_job(
            conn,
            job.id,
            job.state,
            decision.job_state,
            at=at,
            attempt_id=attempt_id,
            reason=decision.reason,
            changes=changes,
        )
    return True


def _earlier_losses_s(conn: Connection, job_id: str, attempt_id: str, at: datetime) -> list[float]:
    """How long ago each other attempt of the job that was LOST within the past hour ended."""
    since = at - timedelta(seconds=LOSS_WINDOW_S)
    ended = conn.execute(
        select(attempts.c.ended_at).where(
            attempts.c.job_id == job_id,
            attempts.c.id != attempt_id,
            attempts.c.state == AttemptState.LOST,
            attempts.c.ended_at > since,
        )
    ).scalars()
    return [(at - when).total_seconds() for when in ended]


def expired(conn: Connection, now: datetime) -> list[str]:
    """Live attempts whose lease has passed: neither their workers nor their launcher renewed it."""
    rows = conn.execute(
        select(attempts.c.id)
        .where(attempts.c.state.in_(LIVE), attempts.c.lease_expires_at < now)
        .order_by(attempts.c.lease_expires_at)
    )
    return list(rows.scalars())


def leased_gpus(conn: Connection) -> dict[str, set[int]]:
    held: dict[str, set[int]] = {}
    for node, gpu in conn.execute(select(leases.c.node, leases.c.gpu_index)):
        held.setdefault(node, set()).add(gpu)
    return held


def leased_by_team(conn: Connection) -> tuple[dict[str, int], dict[str, int]]:
    """The GPUs each team holds leases on, and of those the ones its attempts borrowed."""
    rows = conn.execute(
        select(jobs.c.team, attempts.c.borrowed, func.count())
        .select_from(leases.join(attempts, attempts.c.id == leases.c.attempt_id))
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .group_by(jobs.c.team, attempts.c.borrowed)
    )
    held: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for team, was_borrowed, gpus in rows:
        held[team] = held.get(team, 0) + gpus
        if was_borrowed:
            borrowed[team] = borrowed.get(team, 0) + gpus
    return held, borrowed


# The newest measured attempts of a family a pass reads: a pipeline's retrainings accumulate
# attempts for ever, and the sizing needs the newest measure of each shape it ran, no history.
MEASURES_PER_FAMILY = 32


def measured(conn: Connection, families: set[tuple[str, str]]) -> dict[tuple[str, str], list[Attempt]]:
    """The attempts that reported a step time (the heartbeat's `throughput`), of the jobs of each
    (team, name) of `families`, the newest `MEASURES_PER_FAMILY` of each, oldest first: what an
    elastic job's sizing fits its model to."""
    if not families:
        return {}
    newest = (
        func.row_number()
        .over(partition_by=(jobs.c.team, jobs.c.name), order_by=attempts.c.created_at.desc())
        .label("newest")
    )
    ranked = (
        select(attempts, jobs.c.team.label("family_team"), jobs.c.name.label("family_name"), newest)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(tuple_(jobs.c.team, jobs.c.name).in_(sorted(families)), attempts.c.step_s.is_not(None))
        .subquery()
    )
    rows = conn.execute(
        select(ranked).where(ranked.c.newest <= MEASURES_PER_FAMILY).order_by(ranked.c.created_at)
    )
    found: dict[tuple[str, str], list[Attempt]] = {}
    for row in rows:
        found.setdefault((row.family_team, row.family_name), []).append(attempt_from_row(row))
    return found


def pending_jobs(conn: Connection, now: datetime, specs: SpecCache | None = None) -> list[Job]:
    """The jobs a pass may place, in submission order (their specs from `specs`)."""
    rows = conn.execute(
        select(jobs)
        .where(
            jobs.c.state == JobState.PENDING.value,
            jobs.c.cancel_requested.is_(False),
            (jobs.c.not_before.is_(None)) | (jobs.c.not_before <= now),
        )
        .order_by(jobs.c.seq)
    )
    return [job_from_row(row, specs=specs) for row in rows]


def metric_records(conn: Connection, since: datetime) -> tuple[list[AttemptRecord], list[JobRecord]]:
    """Attempts and jobs created since `since`, as the platform metrics read them."""
    first = (
        select(attempts.c.job_id, func.min(attempts.c.created_at).label("first_at"))
        .group_by(attempts.c.job_id)
        .subquery()
    )
    job_rows = conn.execute(
        select(jobs.c.id, jobs.c.team, jobs.c.state, jobs.c.created_at, first.c.first_at)
        .outerjoin(first, first.c.job_id == jobs.c.id)
        .where(jobs.c.created_at >= since)
    )
    job_list = [JobRecord(r.id, r.team, r.state, r.created_at, r.first_at) for r in job_rows]
    attempt_rows = conn.execute(
        select(attempts, jobs.c.team)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.created_at >= since)
    )
    attempt_list = [
        AttemptRecord(
            job_id=r.job_id,
            team=r.team,
            number=r.number,
            state=r.state,
            slices=tuple((n["node"], len(n["gpus"])) for n in r.placement.get("nodes", [])),
            created_at=r.created_at,
            started_at=r.started_at,
            ended_at=r.ended_at,
            progress_lost_s=r.progress_lost_s or 0.0,
            resumed=r.resume_step is not None,
            restore_s=r.restore_s or 0.0,
            checkpoint_stall_s=r.checkpoint_stall_s or 0.0,
            new_step_at=r.new_step_at,
        )
        for r in attempt_rows
    ]
    return attempt_list, job_list
