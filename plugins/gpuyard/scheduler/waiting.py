"""Why each pending job waits, as the pass decides it, recorded for the API (store/waits.py).

A reason is a short code the queue is filtered by and the cycle's own words: `quota` (over quota, no
idle quota in the cohort to borrow), `no-room` (no domain has room for the whole gang, or none of
its own site while its policy keeps it there), `reservation` (GPUs are held for it while preempted
attempts stop), `starting` (placed by this pass: its attempt starts), `copying` (placed at another
site than its newest checkpoint: it waits for the copy to land there, scheduler/mover.py), `behind`
(a policy without backfill stops at the first job that does not fit). The codes a job's row gives (backoff,
cancelling, unseen) are domain/waiting.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import Engine

from gpuyard.domain.model import Job
from gpuyard.domain.waiting import Reason, RecordedReason
from gpuyard.scheduler.cycle import NO_ROOM, NO_ROOM_AT_SITE, OVER_QUOTA, STOPPING, CycleResult
from gpuyard.store import waits as wait_store
from gpuyard.store.leadership import Lead
from gpuyard.store.transfers import CheckpointTransfer

_CODE_OF = {OVER_QUOTA: "quota", NO_ROOM: "no-room", NO_ROOM_AT_SITE: "no-room", STOPPING: "reservation"}
# the codes of the reasons a cycle gives (reason_code)
CYCLE_CODES = (*dict.fromkeys(_CODE_OF.values()), "other")
STARTING = "placed: its attempt starts"
BEHIND = "not looked at: a job ahead of it does not fit, and the policy does not backfill"


def copying_reason(transfer: CheckpointTransfer) -> Reason:
    """The reason of a job whose checkpoint is on its way to another site, with how far it is."""
    return Reason(
        "copying",
        f"copying its checkpoint to site {transfer.site}: {transfer.bytes_done} of {transfer.bytes_total} "
        f"bytes landed, deadline {transfer.deadline_at.isoformat(timespec='seconds')}",
    )


def reason_code(text: str) -> str:
    """The code of a reason the cycle gave in its own words (`CycleResult.waiting`)."""
    return _CODE_OF.get(text, "other")


def reasons(result: CycleResult, pending: Iterable[str]) -> dict[str, Reason]:
    """Each pending job's reason after the cycle `result` (every job of `pending` gets one)."""
    found = {job_id: Reason(reason_code(text), text) for job_id, text in result.waiting.items()}
    for placed in result.placed:
        found[placed.job.id] = Reason("starting", STARTING)
    return {job_id: found.get(job_id, Reason("behind", BEHIND)) for job_id in pending}


class WaitRecorder:
    """Writes each pass's reasons, only what changed since the last pass this replica recorded: a
    steady queue of 10,000 costs no write. `forget` on a new lead (the rows may be another's)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._written: dict[str, tuple[Reason, datetime]] = {}  # job id -> reason, job row it was for

    def forget(self) -> None:
        self._written.clear()
        wait_store.forget_left(self.engine)

    def record(
        self, now_reasons: dict[str, Reason], jobs: dict[str, Job], *, at: datetime, lead: Lead | None
    ) -> None:
        changed = {
            job_id: RecordedReason(reason, at, jobs[job_id].updated_at)
            for job_id, reason in now_reasons.items()
            if self._written.get(job_id) != (reason, jobs[job_id].updated_at)
        }
        gone = [job_id for job_id in self._written if job_id not in now_reasons]
        wait_store.record(self.engine, changed, gone, lead=lead, now=at)
        for job_id in gone:
            del self._written[job_id]
        self._written.update({job_id: (r.reason, r.job_updated_at) for job_id, r in changed.items()})
