"""Why each pending job waits, as the scheduler says it: the pure cycle run on the store's snapshot,
with its decisions read and nothing reserved (the service's pass runs the same code on the same data).

A reason is a short code the queue is filtered by and the cycle's own words: `quota` (over quota, no
idle quota in the cohort to borrow), `no-room` (no domain has room for the whole gang), `reservation`
(GPUs are held for it while preempted attempts stop), `starting` (it fits now: the next pass places
it), `behind` (a policy without backfill stops at the first job that does not fit), and, read from
the job's row, `backoff` (a retry waits until its `not_before`) and `cancelling`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from gpuyard.domain.fleet import Fleet
from gpuyard.scheduler import inputs
from gpuyard.scheduler.cycle import NO_ROOM, OVER_QUOTA, STOPPING, run_cycle
from gpuyard.scheduler.policy import Policy
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob

CODES = ("quota", "no-room", "reservation", "starting", "behind", "backoff", "cancelling", "other")
_CODE_OF = {OVER_QUOTA: "quota", NO_ROOM: "no-room", STOPPING: "reservation"}
CYCLE_CODES = (*_CODE_OF.values(), "other")  # the codes of the reasons a cycle gives (reason_code)
STARTING = "fits now: the scheduler's next pass places it"
BEHIND = "not looked at: a job ahead of it does not fit, and the policy does not backfill"


@dataclass(frozen=True)
class Reason:
    code: str  # one of CODES
    text: str


@dataclass(frozen=True)
class QueueView:
    """The cycle's reading of the queue now: why each schedulable job waits, and the teams' use."""

    reasons: dict[str, Reason]  # job id -> why it waits (schedulable jobs only)
    usage: dict[str, int]  # GPUs held per team
    borrowed: dict[str, int]  # of which borrowed from the cohort


def reason_code(text: str) -> str:
    """The code of a reason the cycle gave in its own words (`CycleResult.waiting`)."""
    return _CODE_OF.get(text, "other")


def snapshot(conn: Connection, fleet: Fleet, now: datetime) -> tuple[list[PendingJob], ClusterState]:
    """What a scheduling pass sees: the schedulable jobs and the cluster (SchedulerService.snapshot).
    A reading of its own: it indexes the fleet afresh, as one cycle costs far more."""
    waiting, state = inputs.read(conn, FleetIndex(fleet), now)
    return [inputs.pending_job(job) for job in waiting], state


def read_queue(conn: Connection, fleet: Fleet, policy: Policy, now: datetime) -> QueueView:
    pending, state = snapshot(conn, fleet, now)
    usage, borrowed = dict(state.usage), dict(state.borrowed)  # before the cycle takes GPUs
    result = run_cycle(pending, state, now, policy)
    reasons = {job_id: Reason(reason_code(text), text) for job_id, text in result.waiting.items()}
    for placed in result.placed:
        reasons[placed.job.id] = Reason("starting", STARTING)
    for job in pending:
        reasons.setdefault(job.id, Reason("behind", BEHIND))
    return QueueView(reasons=reasons, usage=usage, borrowed=borrowed)


def row_reason(
    view: QueueView, job_id: str, not_before: datetime | None, cancel: bool, now: datetime
) -> Reason:
    """A pending job's reason: from its row when the cycle does not see it (backoff, cancel)."""
    if cancel:
        return Reason("cancelling", "cancel requested: it leaves the queue")
    if not_before is not None and not_before > now:
        return Reason("backoff", f"retry backoff until {not_before.isoformat(timespec='seconds')}")
    return view.reasons.get(job_id, Reason("starting", STARTING))
