"""What happened, as plain values: the store's rows and event log, the workers' journal, their exit
files, and what the suite itself did (submissions, cancels, kills). The invariant checker reads only
these, so it is pure and can be fed a made-up history in tests.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuyard.store.tables import attempts, events, jobs
from sqlalchemy import Engine, select

TERMINAL_ATTEMPT_EVENTS = {f"attempt.{s}" for s in ("succeeded", "failed", "preempted", "lost", "cancelled")}
FINAL_JOB_STATES = {"SUCCEEDED", "FAILED", "CANCELLED"}


@dataclass(frozen=True)
class JobRow:
    id: str
    state: str
    failures: int
    attempt_count: int
    cancel_requested: bool
    max_failures: int
    idempotency_key: str | None
    name: str
    reason: str | None = None


@dataclass(frozen=True)
class AttemptRow:
    id: str
    job_id: str
    number: int
    state: str
    gpus: tuple[tuple[str, int], ...]  # (node, gpu index) of its placement
    exit_code: int | None = None
    stop_requested: str | None = None
    progress_lost_s: float | None = None
    reason: str | None = None
    ended_at: float | None = None  # when the platform recorded its end, on the journal's clock


@dataclass(frozen=True)
class EventRow:
    seq: int
    type: str
    job_id: str
    attempt_id: str | None
    data: dict[str, Any]
    at: str | None = None  # the writer's clock (for people reading a history; checks use `seq`)


@dataclass(frozen=True)
class Record:
    """One line of a worker's journal (tests/faults/worker.py); `t` is the machine's monotonic clock."""

    e: str
    attempt: str
    job: str
    rank: int
    t: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Submission:
    key: str
    kind: str
    job_id: str | None = None  # from the first 200/201
    accepted: bool = False
    ids: set[str] = field(default_factory=set)  # every id an answer named: one, or a lost promise


@dataclass
class CancelRequest:
    job_id: str
    status: int | None = None  # the definite answer: 200 (cancelled or stopping), 409 (already final)
    state: str | None = None  # the job's state in that answer


@dataclass
class History:
    jobs: dict[str, JobRow]
    attempts: dict[str, AttemptRow]
    events: list[EventRow]
    journal: list[Record] = field(default_factory=list)
    exits: dict[str, dict[int, int]] = field(default_factory=dict)  # attempt -> rank -> exit status
    submissions: list[Submission] = field(default_factory=list)
    cancels: list[CancelRequest] = field(default_factory=list)
    kills: dict[str, float] = field(default_factory=dict)  # attempt -> monotonic time the suite killed it
    # attempt -> monotonic time the suite had the cluster take its pod away (an eviction, a deletion)
    disruptions: dict[str, float] = field(default_factory=dict)
    # attempt -> (from, to) when the node of a pod of it reported nothing (monotonic): what ended
    # there meanwhile the platform could not know
    unheard: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)  # attempt -> monotonic time its shims saw it end
    # attempt -> monotonic time its launcher recorded its verdict (the workers were gone by then)
    verdicts: dict[str, float] = field(default_factory=dict)
    leftovers: dict[str, list[int]] = field(default_factory=dict)  # attempt -> pids alive after the end
    stuck: dict[str, str] = field(default_factory=dict)  # attempt -> what its leftovers did (stacks.py)
    lease_s: float = 10.0
    stalls: list[tuple[float, float]] = field(default_factory=list)  # the control plane faulted (monotonic)


def read_store(engine: Engine) -> tuple[dict[str, JobRow], dict[str, AttemptRow], list[EventRow]]:
    offset = time.time() - time.monotonic()  # the store's times are the database's wall clock, never skewed
    with engine.connect() as conn:
        job_rows = {
            r.id: JobRow(
                id=r.id,
                state=r.state,
                failures=r.failures,
                attempt_count=r.attempt_count,
                cancel_requested=bool(r.cancel_requested),
                max_failures=int(r.spec.get("retry", {}).get("max_failures", 2)),
                idempotency_key=r.idempotency_key,
                name=r.name,
                reason=r.reason,
            )
            for r in conn.execute(select(jobs))
        }
        attempt_rows = {
            r.id: AttemptRow(
                id=r.id,
                job_id=r.job_id,
                number=r.number,
                state=r.state,
                gpus=tuple(
                    (node["node"], int(gpu)) for node in r.placement.get("nodes", []) for gpu in node["gpus"]
                ),
                exit_code=r.exit_code,
                stop_requested=r.stop_requested,
                progress_lost_s=r.progress_lost_s,
                reason=r.reason,
                ended_at=r.ended_at.timestamp() - offset if r.ended_at else None,
            )
            for r in conn.execute(select(attempts))
        }
        event_rows = [
            EventRow(r.seq, r.type, r.job_id, r.attempt_id, dict(r.data or {}), r.at.isoformat())
            for r in conn.execute(select(events).order_by(events.c.seq))
        ]
    return job_rows, attempt_rows, event_rows


def read_exits(attempts_dir: Path) -> dict[str, dict[int, int]]:
    """The exit status each worker's shim recorded (`rankN.exit`), by attempt and rank."""
    found: dict[str, dict[int, int]] = {}
    for path in attempts_dir.glob("*/rank*.exit"):
        try:
            found.setdefault(path.parent.name, {})[int(path.stem.removeprefix("rank"))] = int(
                path.read_text()
            )
        except (OSError, ValueError):
            continue
    return found


def read_exit_times(attempts_dir: Path) -> dict[str, float]:
    """When each attempt's last shim recorded its worker's end, on the monotonic clock of the journal."""
    return _latest_mtimes(attempts_dir, "*/rank*.exit")


def read_verdict_times(attempts_dir: Path) -> dict[str, float]:
    """When the launcher recorded each attempt's verdict (its `ended` file), on the journal's clock:
    every worker of it was gone by then, though a worker killed with its shim left no time of its own."""
    return _latest_mtimes(attempts_dir, "*/ended")


def _latest_mtimes(attempts_dir: Path, pattern: str) -> dict[str, float]:
    """Per attempt folder, the newest modification time of its files matching `pattern`, on the
    monotonic clock of the journal (the files' times are the wall clock's, which the suite never
    skews)."""
    offset = time.time() - time.monotonic()
    found: dict[str, float] = {}
    for path in attempts_dir.glob(pattern):
        with contextlib.suppress(OSError):
            found[path.parent.name] = max(found.get(path.parent.name, 0.0), path.stat().st_mtime - offset)
    return found


class JournalCollector:
    """Receives the workers' journal datagrams on a Unix socket; keeps them and copies them to a file."""

    def __init__(self, path: Path, copy: Path):
        self.path, self.copy = path, copy
        self.records: list[Record] = []
        self._changed = threading.Condition()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(path))
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._thread = threading.Thread(target=self._receive, name="journal", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        with self.copy.open("a") as out:
            while True:
                try:
                    raw = self._socket.recv(65536)
                except OSError:
                    return
                line = json.loads(raw)
                record = Record(
                    e=line.pop("e"),
                    attempt=line.pop("attempt"),
                    job=line.pop("job"),
                    rank=int(line.pop("rank")),
                    t=float(line.pop("t")),
                    data=line,
                )
                out.write(raw.decode() + "\n")
                with self._changed:
                    self.records.append(record)
                    self._changed.notify_all()

    def wait_for(self, predicate: Any, timeout_s: float) -> Record | None:
        """The first record (old or new) for which `predicate` holds, waiting up to `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(
                lambda: next((r for r in self.records if predicate(r)), None), timeout=timeout_s
            )

    def close(self) -> None:
        self._socket.close()
        self.path.unlink(missing_ok=True)
