"""The two state machines, job and attempt: the only place that says which transitions exist.

The store applies a transition as a guarded `UPDATE ... WHERE state = <expected>` and asks this
module first, so an illegal transition is an error and a concurrent one is detected, never
silently overwritten.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class AttemptState(StrEnum):
    CREATED = "CREATED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"
    CANCELLED = "CANCELLED"


JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED}),
    # SCHEDULED -> PENDING: the launch failed or the attempt was lost before it ran (a retry).
    JobState.SCHEDULED: frozenset({JobState.RUNNING, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    # RUNNING -> PENDING: preemption or loss; the job waits for its next attempt.
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PENDING}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

_ATTEMPT_ENDINGS = frozenset(
    {AttemptState.FAILED, AttemptState.PREEMPTED, AttemptState.LOST, AttemptState.CANCELLED}
)
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    AttemptState.CREATED: frozenset({AttemptState.LAUNCHING}) | _ATTEMPT_ENDINGS,
    AttemptState.LAUNCHING: frozenset({AttemptState.RUNNING}) | _ATTEMPT_ENDINGS,
    AttemptState.RUNNING: frozenset({AttemptState.SUCCEEDED}) | _ATTEMPT_ENDINGS,
    **{state: frozenset() for state in (AttemptState.SUCCEEDED, *_ATTEMPT_ENDINGS)},
}


class StopReason(StrEnum):
    """Why the platform asked a live attempt to stop (its `stop_requested`). The heartbeat answer is
    `checkpoint_and_stop` for each; how the attempt's end counts depends on which (domain/retry.py)."""

    PREEMPT = "preempt"  # an eviction or an admin's preemption: not the job's fault
    CANCEL = "cancel"  # the job was cancelled
    HANG = "hang"  # no progress within liveness.progress_timeout: a failure
    MAX_RUNTIME = "max_runtime"  # the job ran out of its max_runtime: fails for good

    @classmethod
    def read(cls, stored: str | None) -> StopReason | None:
        """Rows written before stop reasons had kinds say `checkpoint_and_stop`: a preemption."""
        if stored is None:
            return None
        return cls(stored) if stored in cls._value2member_map_ else cls.PREEMPT


TERMINAL_JOB_STATES = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)
TERMINAL_ATTEMPT_STATES = frozenset(s for s, nxt in ATTEMPT_TRANSITIONS.items() if not nxt)


class IllegalTransition(Exception):
    """The state machine has no such edge."""

    def __init__(self, kind: str, current: str, target: str):
        self.kind, self.current, self.target = kind, current, target
        allowed = sorted(
            (JOB_TRANSITIONS if kind == "job" else ATTEMPT_TRANSITIONS).get(current, ())  # type: ignore[call-overload]
        )
        super().__init__(
            f"{kind} cannot go from {current} to {target}; from {current} it may go to "
            f"{', '.join(allowed) or 'nothing (terminal state)'}"
        )


class StaleState(Exception):
    """The row was not in the expected state any more: another actor moved it first."""

    def __init__(self, kind: str, key: str, expected: str, actual: str | None):
        self.kind, self.key, self.expected, self.actual = kind, key, expected, actual
        super().__init__(f"{kind} {key} was expected in {expected} but is {actual or 'missing'}")


def check_job_transition(current: JobState, target: JobState) -> None:
    if target not in JOB_TRANSITIONS[current]:
        raise IllegalTransition("job", current, target)


def check_attempt_transition(current: AttemptState, target: AttemptState) -> None:
    if target not in ATTEMPT_TRANSITIONS[current]:
        raise IllegalTransition("attempt", current, target)
