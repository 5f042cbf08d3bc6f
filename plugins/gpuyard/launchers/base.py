"""The launcher interface. The scheduler and the API never know which launcher runs.

A launcher is level-triggered: `launch` and `cancel` are idempotent per attempt, `observe`
reports what became of the workers, and `reconcile` (after a restart) adopts the workers of live
attempts and removes any that belong to no live attempt.

Delivery is at least once: `observe` repeats a report until the scheduler `acknowledge`s it (after
the store has it), so a store error or a restart never loses how an attempt ended. `alive` is the
launcher's own evidence of liveness (processes exist, pods run on Ready nodes): the scheduler renews
those attempts' leases, so a command that never heartbeats still lives as long as its workers do.
`release` stops whatever still runs of an attempt and says whether anything might: an attempt is
declared LOST, and its job placed again, only once nothing of it can run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from gpuyard.domain.placement import Placement
from gpuyard.domain.spec import JobSpec
from training.exit_codes import PREEMPTED as EXIT_PREEMPTED
from training.exit_codes import STALE_FENCING_TOKEN as EXIT_STALE_TOKEN
from training.exit_codes import SUCCESS as EXIT_SUCCEEDED


class Outcome(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"  # the worker saved a checkpoint and stopped on request
    LOST = "LOST"  # the node or the process vanished: not the job's fault


@dataclass(frozen=True)
class LaunchRequest:
    attempt_id: str
    job_id: str
    attempt_number: int
    fencing_token: int
    # The workers' proof of their attempt on heartbeats (GPUYARD_ATTEMPT_SECRET): out of repr, so no
    # log line of a request shows it; a launcher passes it as it passes a secret, never as plain text.
    attempt_secret: str = field(repr=False)
    spec: JobSpec
    placement: Placement
    api_url: str
    checkpoint_url: str | None
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables, e.g. the MLflow run id
    launched_before: bool = False  # the store says it was launched (LAUNCHING or RUNNING): workers existed


@dataclass(frozen=True)
class WorkerReport:
    """What a launcher observed about one attempt's workers."""

    attempt_id: str
    outcome: Outcome
    at: datetime
    exit_code: int | None = None
    reason: str | None = None
    disrupted: bool = False  # the platform stopped or lost these workers (its signal, an eviction, a node)


def outcome_of_exit(code: int) -> tuple[Outcome, str]:
    """Map a worker's exit status (negative: killed by that signal) to an outcome and a reason."""
    if code == EXIT_SUCCEEDED:
        return Outcome.SUCCEEDED, "exited 0"
    if code == EXIT_PREEMPTED:
        return Outcome.PREEMPTED, f"exited {EXIT_PREEMPTED}: checkpoint saved, stopped on request"
    if code == EXIT_STALE_TOKEN:
        return Outcome.LOST, f"exited {EXIT_STALE_TOKEN}: fencing token refused, a newer attempt owns the job"
    if code < 0:
        return Outcome.FAILED, f"killed by signal {-code}"
    return Outcome.FAILED, f"exited {code}"


class LaunchBusy(RuntimeError):
    """Another process is launching this attempt and has not finished (it may be paused): nothing
    was started. The attempt stays reserved; its launch is left to that process or to its lease."""


class Launcher(Protocol):
    def launch(self, request: LaunchRequest) -> None:
        """Start the attempt's workers; launching an attempt that already has workers does nothing."""

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        """Ask the workers to stop (SIGTERM), and kill what still runs after `grace_s`."""

    def observe(self) -> list[WorkerReport]:
        """Every report not yet acknowledged: workers running, and attempts whose workers all ended."""
        ...

    def acknowledge(self, report: WorkerReport) -> None:
        """The store has this report: stop repeating it (an ending also forgets the attempt)."""

    def alive(self) -> Mapping[str, int]:
        """Attempts whose workers this launcher sees alive now, with the fencing token it launched
        them with (the scheduler renews their leases with it)."""
        ...

    def starting(self) -> Mapping[str, int]:
        """Attempts whose workers are on their way up with progress (a large image being pulled),
        with their fencing token: the scheduler renews their leases, and they stay LAUNCHING. A
        launcher whose workers start at once has none."""
        ...

    def release(self, attempt_id: str) -> bool:
        """Stop at once whatever still runs of the attempt; True when nothing of it can run any more
        (its workers are gone, or their node is known dead)."""
        ...

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        """After a restart: adopt workers of `live` attempts, stop those of any other attempt,
        and report LOST for launched live attempts (`launched_before`) that have no workers any
        more. One reserved but not launched is never lost: whatever of it exists is kept for its
        launch, which follows and completes it."""
        ...

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        """The attempt's worker output, line by line, each line with its newline (as a file reads:
        the API streams them as they are); with `follow`, until the workers end."""
        ...
