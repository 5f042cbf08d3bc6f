"""Why a pending job waits: the codes the queue is filtered by, and the reading of a job's row.

The scheduler records each schedulable job's reason as its pass decides (scheduler/waiting.py, kept
in the store's `waits` table); the API reads that record and never runs a cycle. Two reasons come
from the job's row instead, since a pass does not look at such jobs: `backoff` (a retry waits until
its `not_before`) and `cancelling`. A job the scheduler has not looked at since it (re)entered the
queue (or changed) is `unseen`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

CODES = (
    "quota",
    "no-room",
    "reservation",
    "starting",
    "copying",
    "behind",
    "backoff",
    "cancelling",
    "unseen",
    "other",
)
UNSEEN = "not looked at yet: the scheduler's next pass reads it"


@dataclass(frozen=True)
class Reason:
    code: str  # one of CODES
    text: str


@dataclass(frozen=True)
class RecordedReason:
    """A reason as the scheduler recorded it: since when it holds, and the job's row as the pass read
    it (its `updated_at`), so a reason older than the job's last change is not taken for its own."""

    reason: Reason
    since: datetime
    job_updated_at: datetime


def row_reason(
    recorded: RecordedReason | None,
    *,
    updated_at: datetime,
    not_before: datetime | None,
    cancel: bool,
    now: datetime,
) -> tuple[Reason, datetime | None]:
    """A pending job's reason, and since when the scheduler has given it (None: read from the row).
    From its row where a pass does not see it (backoff, cancel), else the scheduler's, unless that was
    recorded before the job's row last changed (it re-entered the queue since)."""
    if cancel:
        return Reason("cancelling", "cancel requested: it leaves the queue"), None
    if not_before is not None and not_before > now:
        return Reason("backoff", f"retry backoff until {not_before.isoformat(timespec='seconds')}"), None
    if recorded is None or recorded.job_updated_at != updated_at:
        return Reason("unseen", UNSEEN), None
    return recorded.reason, recorded.since
