"""The launcher interface. The scheduler and the API never know which launcher runs.

A launcher is level-triggered: `launch` and `cancel` are idempotent per attempt, `observe`
reports what became of the workers, and `reconcile` (after a restart) adopts the workers of live
attempts and removes any that belong to no live attempt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from gpuyard.domain.placement import Placement
from gpuyard.domain.spec import JobSpec

# Worker exit codes (training/exit_codes.py defines the same numbers for the worker side).
EXIT_SUCCEEDED = 0
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on request after saving a checkpoint
EXIT_STALE_TOKEN = 76  # the control plane refused our fencing token: stopped without writing


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


class Launcher(Protocol):
    def launch(self, request: LaunchRequest) -> None:
        """Start the attempt's workers; launching an attempt that already has workers does nothing."""

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        """Ask the workers to stop (SIGTERM), and kill what still runs after `grace_s`."""

    def observe(self) -> list[WorkerReport]:
        """Reports since the last call: workers running, and attempts whose workers all ended."""
        ...

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        """After a restart: adopt workers of `live` attempts, stop those of any other attempt,
        and report LOST for live attempts that have no workers any more."""
        ...

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        """The attempt's worker output, line by line; with `follow`, until the workers end."""
        ...
