"""Reserve: the placements of one cycle become attempts, one transaction per batch, all-or-nothing
per gang. The store's only way to create an attempt, for the scheduler and the tests alike.

Each placement becomes an attempt row (CREATED, a fresh fencing token from the shared counter, an
unguessable id, a random secret its workers prove it with), one `leases` row per GPU, whose primary
key (node, gpu_index) makes a double lease impossible, and its job moved PENDING -> SCHEDULED with
its event, in the same transaction. With `lead`, the transaction first confirms the scheduler's lead
and holds the lease row until it commits (`leadership.confirm`): a replica that lost the lead
reserves nothing, and the lead cannot change hands while a reservation under it commits. A gang
whose job is no longer PENDING, or one of whose GPUs is already leased (by another replica, or by an
earlier gang of the same batch), gets None and leaves no row behind; the rest of the batch goes on.

Set-based, so a batch costs a few statements, not a transaction (and several statements) per attempt:
its jobs are locked first, in id order (every transaction of the store locks a job before its
attempts and leases, so two writers of one job queue instead of deadlocking), a block of fencing
tokens is taken in one update, attempts and leases are inserted in bulk (lease rows in (node, gpu)
order, so two batches wanting the same GPUs cannot deadlock either, and with ON CONFLICT DO NOTHING),
the gangs that did not get every GPU are deleted again, and the others' jobs move in one guarded
statement (`transitions.move_jobs`).

Leases expire at `at` plus the lease period: `at` is the database's time in production (the
service's clock is `store.dbclock.DatabaseClock`), so leases are written and reaped with one clock.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from gpuyard.domain.attempt_secret import new_attempt_secret
from gpuyard.domain.model import Attempt
from gpuyard.domain.placement import Placement
from gpuyard.domain.states import AttemptState, JobState
from gpuyard.store import leadership
from gpuyard.store.jobs import attempt_from_row
from gpuyard.store.leadership import Lead
from gpuyard.store.tables import attempts, fencing, jobs, leases
from gpuyard.store.transitions import JobMove, move_jobs

# Gangs per transaction: bounds how long a batch holds its job locks and how big its statements get.
BATCH = 256


@dataclass(frozen=True)
class Reservation:
    """A placement the cycle chose for a job."""

    job_id: str
    placement: Placement
    borrowed: bool


def reserve_batch(
    engine: Engine,
    wanted: Sequence[Reservation],
    *,
    at: datetime,
    lease_ttl_s: float,
    batch: int = BATCH,
    lead: Lead | None = None,
) -> list[Attempt | None]:
    """Reserve every placement of `wanted`, `batch` gangs per transaction. Returns, in the same
    order, the attempt created for each, or None for a gang that could not have all its GPUs or whose
    job is no longer PENDING (nothing of it is written). With `lead`, each batch first confirms that
    lead (`leadership.confirm`); NotLeading stops the reservations, keeping the batches committed."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1 gang, got {batch}")
    reserved: list[Attempt | None] = []
    for first in range(0, len(wanted), batch):
        with leadership.fenced(engine, lead, now=at) as conn:
            reserved += reserve_in(conn, wanted[first : first + batch], at=at, lease_ttl_s=lease_ttl_s)
    return reserved


def fencing_tokens(conn: Connection, count: int) -> range:
    """`count` fresh fencing tokens from the counter every replica shares, in one update."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(fencing).values(name="leases", value=0).on_conflict_do_nothing())
    last = conn.execute(
        update(fencing)
        .where(fencing.c.name == "leases")
        .values(value=fencing.c.value + count)
        .returning(fencing.c.value)
    ).scalar_one()
    return range(int(last) - count + 1, int(last) + 1)


def reserve_in(
    conn: Connection, wanted: Sequence[Reservation], *, at: datetime, lease_ttl_s: float
) -> list[Attempt | None]:
    """One batch, in the caller's transaction (`reserve_batch` opens one per batch)."""
    ids = sorted({r.job_id for r in wanted})
    pending = {
        row.id: row
        for row in conn.execute(
            select(
                jobs.c.id, jobs.c.state, jobs.c.attempt_count, jobs.c.checkpoint_url, jobs.c.checkpoint_step
            )
            .where(jobs.c.id.in_(ids))
            .order_by(jobs.c.id)
            .with_for_update()
        )
        if row.state == JobState.PENDING.value
    }
    chosen: dict[str, int] = {}  # job id -> its placement; a second one of the same job gets None
    for i, reservation in enumerate(wanted):
        if reservation.job_id in pending:
            chosen.setdefault(reservation.job_id, i)
    if not chosen:
        return [None] * len(wanted)
    tokens = iter(fencing_tokens(conn, len(chosen)))
    expires = at + timedelta(seconds=lease_ttl_s)  # one instant for the attempt and all its GPUs
    rows, gpus, attempt_of = [], [], {}
    for job_id, i in chosen.items():
        job, placement = pending[job_id], wanted[i].placement
        number = job.attempt_count + 1
        attempt_id = f"{job_id}-a{number}-{secrets.token_hex(8)}"
        token = next(tokens)
        attempt_of[i] = attempt_id
        rows.append(
            {
                "id": attempt_id,
                "job_id": job_id,
                "number": number,
                "state": AttemptState.CREATED.value,
                "fencing_token": token,
                "attempt_secret": new_attempt_secret(),
                "placement": placement.to_json(),
                "borrowed": wanted[i].borrowed,
                "checkpoint_url": job.checkpoint_url,
                "checkpoint_step": job.checkpoint_step,
                "resume_step": job.checkpoint_step,
                "lease_expires_at": expires,
                "created_at": at,
                "updated_at": at,
            }
        )
        gpus += [
            (piece.node, gpu, attempt_id, token) for piece in placement.slices for gpu in piece.gpu_indices
        ]
    conn.execute(insert(attempts), rows)
    asked: dict[str, int] = {}
    for _, _, attempt_id, _ in gpus:
        asked[attempt_id] = asked.get(attempt_id, 0) + 1
    got = dict.fromkeys(asked, 0)
    if gpus:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        gpus.sort()  # every batch takes lease rows in one order: two replicas cannot deadlock on them
        taken = conn.execute(
            dialect.insert(leases).on_conflict_do_nothing().returning(leases.c.attempt_id),
            [
                {"node": n, "gpu_index": g, "attempt_id": a, "fencing_token": t, "expires_at": expires}
                for n, g, a, t in gpus
            ],
        )
        for (attempt_id,) in taken:
            got[attempt_id] += 1
    # All or nothing per gang: one GPU already leased, and none of its rows stay.
    short = {attempt_id for attempt_id, count in asked.items() if got[attempt_id] < count}
    if short:
        conn.execute(delete(leases).where(leases.c.attempt_id.in_(sorted(short))))
        conn.execute(delete(attempts).where(attempts.c.id.in_(sorted(short))))
    kept = {i: a for i, a in attempt_of.items() if a not in short}
    moves = []
    for i, attempt_id in kept.items():
        reservation = wanted[i]
        number = pending[reservation.job_id].attempt_count + 1
        reason = f"attempt {number} on {', '.join(reservation.placement.nodes)}"
        moves.append(JobMove(reservation.job_id, reason, attempt_id, {"attempt_count": number}))
    move_jobs(conn, moves, JobState.PENDING, JobState.SCHEDULED, at=at)
    made = {
        row.id: attempt_from_row(row)
        for row in conn.execute(select(attempts).where(attempts.c.id.in_(list(kept.values()))))
    }
    return [made[kept[i]] if i in kept else None for i in range(len(wanted))]
