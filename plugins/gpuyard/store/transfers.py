"""Checkpoint transfers: a job's checkpoint on its way to another site, one row per job (its newest).

The leading scheduler owns every transfer under way by its epoch (`epoch`): it starts one in a pass
(`start`), its mover records each file verified at the destination (`record_file`) and the landing
(`land`, which makes the copy the job's newest checkpoint), and a pass abandons one that ran past its
deadline or whose job left the queue (`abandon`). Each of these writes confirms the caller's lead in
its own transaction and touches only a row its epoch owns, still COPYING: a replica whose lead passed
writes nothing. A new leader first adopts every transfer under way (`adopt`: its epoch), and its
mover resumes each from the files recorded as landed.

Lock order (docs/concepts.md): the lease row (the caller's `fenced`), then the job's row, then its
transfer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Row, select, update

from gpuyard.domain.states import JobState
from gpuyard.store.outbox import append_event
from gpuyard.store.tables import checkpoint_transfers, jobs


class TransferState(StrEnum):
    COPYING = "COPYING"
    LANDED = "LANDED"
    ABANDONED = "ABANDONED"


@dataclass(frozen=True)
class CheckpointTransfer:
    job_id: str
    state: TransferState
    epoch: int
    source: str  # the step folder copied
    destination: str  # its copy's step folder at `site`
    from_site: str
    site: str
    step: int | None
    bytes_total: int
    bytes_done: int
    files: dict[str, str]  # path -> sha256 of each file verified at the destination
    estimate_s: float
    started_at: datetime
    deadline_at: datetime
    updated_at: datetime
    reason: str | None = None

    @property
    def progress(self) -> dict[str, Any]:
        """What the job's events and the API show of it."""
        return {
            "site": self.site,
            "from_site": self.from_site,
            "state": self.state.value,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "files_done": len(self.files),
            "deadline_at": self.deadline_at.isoformat(),
        }


def _from_row(row: Row[Any]) -> CheckpointTransfer:
    values = dict(row._mapping)
    values["state"] = TransferState(values["state"])
    values["files"] = dict(values["files"] or {})
    return CheckpointTransfer(**values)


def get(conn: Connection, job_id: str, *, lock: bool = False) -> CheckpointTransfer | None:
    query = select(checkpoint_transfers).where(checkpoint_transfers.c.job_id == job_id)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return _from_row(row) if row else None


def under_way(conn: Connection) -> list[CheckpointTransfer]:
    """Every transfer still COPYING, oldest first."""
    rows = conn.execute(
        select(checkpoint_transfers)
        .where(checkpoint_transfers.c.state == TransferState.COPYING.value)
        .order_by(checkpoint_transfers.c.started_at)
    )
    return [_from_row(row) for row in rows]


def abandoned_at(conn: Connection) -> dict[str, datetime]:
    """When each job's newest transfer was abandoned, for the jobs whose newest was: it joined its own
    site's queue again then."""
    rows = conn.execute(
        select(checkpoint_transfers.c.job_id, checkpoint_transfers.c.updated_at).where(
            checkpoint_transfers.c.state == TransferState.ABANDONED.value
        )
    )
    return {job_id: at for job_id, at in rows}


def start(conn: Connection, transfer: CheckpointTransfer) -> bool:
    """Record `transfer` (COPYING, under the caller's fenced transaction and epoch) as its job's newest,
    in place of an ended one; False when one is under way already or the job left the queue."""
    job = conn.execute(select(jobs.c.state).where(jobs.c.id == transfer.job_id).with_for_update()).scalar()
    if job != JobState.PENDING.value:
        return False
    found = get(conn, transfer.job_id, lock=True)
    if found is not None and found.state == TransferState.COPYING:
        return False
    values = {
        "state": TransferState.COPYING.value,
        "epoch": transfer.epoch,
        "source": transfer.source,
        "destination": transfer.destination,
        "from_site": transfer.from_site,
        "site": transfer.site,
        "step": transfer.step,
        "bytes_total": transfer.bytes_total,
        "bytes_done": 0,
        "files": {},
        "estimate_s": transfer.estimate_s,
        "started_at": transfer.started_at,
        "deadline_at": transfer.deadline_at,
        "updated_at": transfer.started_at,
        "reason": None,
    }
    if found is None:
        conn.execute(checkpoint_transfers.insert().values(job_id=transfer.job_id, **values))
    else:
        _set(conn, transfer.job_id, **values)
    append_event(
        conn,
        type="job.transfer_started",
        job_id=transfer.job_id,
        at=transfer.started_at,
        data={
            "from": transfer.source,
            "to": transfer.destination,
            "estimate_s": round(transfer.estimate_s, 3),
            **transfer.progress,
            "bytes_done": 0,
        },
    )
    return True


def adopt(conn: Connection, epoch: int, *, at: datetime) -> list[CheckpointTransfer]:
    """Make every transfer under way the caller's (its new `epoch`, in its fenced transaction): the
    last leader's mover writes nothing more to them. The adopted transfers, as they now stand."""
    conn.execute(
        update(checkpoint_transfers)
        .where(checkpoint_transfers.c.state == TransferState.COPYING.value)
        .values(epoch=epoch, updated_at=at)
    )
    return under_way(conn)


def _set(conn: Connection, job_id: str, **values: Any) -> None:
    conn.execute(update(checkpoint_transfers).where(checkpoint_transfers.c.job_id == job_id).values(**values))


def _owned(conn: Connection, job_id: str, epoch: int) -> CheckpointTransfer | None:
    """The job's transfer, locked, while it is under way and `epoch`'s; else None."""
    found = get(conn, job_id, lock=True)
    if found is None or found.state != TransferState.COPYING or found.epoch != epoch:
        return None
    return found


def record_file(
    conn: Connection, job_id: str, epoch: int, *, name: str, sha256: str, done: int, total: int, at: datetime
) -> bool:
    """One more file verified at the destination (in the caller's fenced transaction); False when the
    transfer is not `epoch`'s under way any more (adopted, abandoned): the copier stops."""
    found = _owned(conn, job_id, epoch)
    if found is None:
        return False
    _set(conn, job_id, files={**found.files, name: sha256}, bytes_done=done, bytes_total=total, updated_at=at)
    append_event(
        conn,
        type="job.transfer_progress",
        job_id=job_id,
        at=at,
        data={"site": found.site, "file": name, "bytes_done": done, "bytes_total": total},
    )
    return True


def land(conn: Connection, job_id: str, epoch: int, *, at: datetime, details: dict[str, Any]) -> bool:
    """The copy is complete and verified: it becomes the job's newest checkpoint (retries resume from
    it, at its site), in the caller's fenced transaction. False when not `epoch`'s under way."""
    conn.execute(select(jobs.c.id).where(jobs.c.id == job_id).with_for_update())  # the job's row first
    found = _owned(conn, job_id, epoch)
    if found is None:
        return False
    _set(conn, job_id, state=TransferState.LANDED.value, updated_at=at)
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(checkpoint_url=found.destination, checkpoint_site=found.site, updated_at=at)
    )
    append_event(
        conn,
        type="job.checkpoint_moved",
        job_id=job_id,
        at=at,
        data={"from": found.source, "to": found.destination, "site": found.site, **details},
    )
    return True


def abandon(conn: Connection, job_id: str, epoch: int, *, at: datetime, reason: str) -> bool:
    """Give the transfer up (in the caller's fenced transaction): the job stays at its own site, its
    wait counting again from now. False when not `epoch`'s under way."""
    found = _owned(conn, job_id, epoch)
    if found is None:
        return False
    _set(conn, job_id, state=TransferState.ABANDONED.value, updated_at=at, reason=reason)
    append_event(
        conn,
        type="job.transfer_abandoned",
        job_id=job_id,
        at=at,
        data={**found.progress, "state": TransferState.ABANDONED.value, "reason": reason},
    )
    return True
