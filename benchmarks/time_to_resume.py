"""Time to resume: how long a running training job is away when it is interrupted, from the moment of
the interruption to its first training step after the restore, in the new attempt.

The control plane runs as production runs it, as real processes (tests/faults/cluster.py): `gpuyard
api` (2 workers), `gpuyard relay` and two `gpuyard scheduler` replicas with the local launcher, on a
throwaway PostgreSQL and Redis of the benchmark's own; a fleet of 4 GPUs for a job of `--ranks` (2:
a DDP gang on one node), so a relaunch never queues. The job is the real training runtime (`python -m
training.run`, DDP on gloo, DCP checkpoints every 5 steps, heartbeats every second) on the fault
suite's tiny model, run by `resume_worker.py`, which journals (on this machine's monotonic clock) what
the runtime does: its start, its restore, each step.

Each measurement submits a fresh job, waits until its first attempt runs and the store has recorded
a checkpoint, interrupts it one way, and waits for the first step of the attempt that resumes it:

- `preempt`: `POST /v1/attempts/{id}/preempt` (the admin's eviction: SIGTERM, save, exit 75);
- `crash`: every worker of the attempt SIGKILLed, shims included (the fault suite's kill-worker);
- `node_loss`: every process of the attempt frozen (the cgroup freezer, else SIGSTOP): silent, so
  only the lease can tell;
- `leader_loss`: a crash, then the leading scheduler SIGKILLed 0 to `--leader-delay` s later (spread
  evenly over the repeats: the leader relaunches a crashed attempt within about 0.3 s here, so the
  kill lands before, during or just after its recovery), and the standby takes over after the leader
  lease (lease / 2); killed components are restarted as a Deployment would (`Cluster.supervise`).

Each interruption prints one line on stderr: the time to resume and where it went, phase by phase
(they add up to it), from the store's events and rank 0's journal: `end` (the interruption until
the store has the old attempt's end: detection, and for a preemption the signal, the save and the
exit), `place` (until the job's next attempt is reserved), `launch` (until that worker's Python runs:
the claim, the shim, the interpreter), `import` (torch and the runtime), `join` (the config and the
ranks' rendezvous), `setup` (data, model, DDP wrap, until the restore begins), `restore` (the
worker's own restore span: checkpoint chosen, verified and loaded) and `step` (until its first step).
Store events are stamped with the database's clock, converted to this machine's monotonic clock. A
job not resumed within `--give-up` gets what the store says of its old attempt instead (its state,
last heartbeat and lease). Then, on stdout, per kind p50 and p99 (the largest value under 100 runs),
each phase's median, the goals, and

    RESULT preempt_p99_s=A crash_p99_s=B node_loss_p99_s=C leader_loss_p99_s=D lease_s=L restore_s=R

with R the median restore span; `inf`: a kind not resumed within `--give-up` s at least once, `nan`:
not run. Goals: A and B <= R + 10 s; C and D <= L + R + 15 s.

    python benchmarks/time_to_resume.py [--repeat 5] [--lease 10] [--kinds preempt,crash,...]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fault suite's modules and their `servers`, as in pytest

from faults import workload  # noqa: E402
from faults.backends import Postgres, Redis  # noqa: E402
from faults.cluster import Cluster, labelled  # noqa: E402
from faults.history import FINAL_JOB_STATES, JournalCollector, Record  # noqa: E402
from faults.pausing import Frozen, thaw_all  # noqa: E402
from gpuyard.client import Endpoint, GpuyardClient  # noqa: E402
from gpuyard.clock import utcnow  # noqa: E402
from gpuyard.domain.feasibility import TeamQuota  # noqa: E402
from gpuyard.store import teams as team_store  # noqa: E402
from gpuyard.store.db import migrate  # noqa: E402
from gpuyard.store.tables import attempts, events, jobs, leaders  # noqa: E402
from harness import free_port, log  # noqa: E402
from sqlalchemy import create_engine, select  # noqa: E402

KINDS = ("preempt", "crash", "node_loss", "leader_loss")
PHASES = ("end", "place", "launch", "import", "join", "setup", "restore", "step")
ENDINGS = {f"attempt.{s}" for s in ("succeeded", "failed", "preempted", "lost", "cancelled")}
WORKER = Path(__file__).parent / "resume_worker.py"
MAX_STEPS = 10**6  # never reached: every job is cancelled once measured
READY_S = 300.0  # the longest wait for a fresh job to run and have a checkpoint recorded (torch on 2 cores)
SETTLE_S = 60.0  # the longest wait for a cancelled job to end and its workers to be gone


@dataclass
class Measurement:
    kind: str
    number: int
    job_id: str
    total_s: float | None = None  # None: not resumed within --give-up
    phases: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def line(self, repeat: int) -> str:
        head = f"{self.kind} {self.number}/{repeat} ({self.job_id})"
        if self.total_s is None:
            return f"{head}: NOT resumed; " + "; ".join(self.notes)
        split = " | ".join(f"{p} {self.phases[p]:.2f}" for p in PHASES if p in self.phases)
        return f"{head}: resumed in {self.total_s:.2f} s ({split}); " + "; ".join(self.notes)


class Bench:
    """The servers, the control plane, the journal and two API clients, each undone by `undo`."""

    def __init__(self, run: Path, lease_s: float, ranks: int, undo: contextlib.ExitStack):
        self.run, self.lease_s, self.ranks = run, lease_s, ranks
        os.chmod(run, 0o755)  # the workers and the postgres user reach into it
        workload.write_runtime_config(run)
        postgres = Postgres()  # each stop is registered first: an interrupted start is undone too
        undo.callback(postgres.stop)
        postgres.start()
        (run / "redis").mkdir()
        redis_server = Redis(run / "redis")
        undo.callback(redis_server.stop)
        redis_server.start()
        self.engine = create_engine(
            postgres.url().replace("postgresql://", "postgresql+psycopg://"), pool_pre_ping=True
        )
        undo.callback(self.engine.dispose)
        self.journal = JournalCollector(run / "journal.sock", run / "journal.jsonl")
        undo.callback(self.journal.close)
        undo.callback(_kill_leftovers, run)
        undo.callback(thaw_all)  # before the kill: a frozen task dies of nothing until thawed
        self.cluster = Cluster(
            run,
            database_url=postgres.url(),
            redis_url=redis_server.url,
            api_port=free_port(),
            lease_s=lease_s,
        )
        migrate(self.engine)
        undo.callback(self.cluster.stop)
        self.cluster.start(self.engine)
        with self.engine.begin() as conn:
            now = utcnow()
            team_store.ensure_team(conn, workload.TEAM, TeamQuota(gpu_quota=64, max_gpus_per_job=4), now)
            member = team_store.create_token(conn, workload.TEAM, team_store.Role.MEMBER, now, "resume")
            admin = team_store.create_token(
                conn, workload.TEAM, team_store.Role.PLATFORM_ADMIN, now, "preempt"
            )
        self.member = GpuyardClient(Endpoint(self.cluster.api_url, member), retry_for_s=60)
        undo.callback(self.member.close)
        self.admin = GpuyardClient(Endpoint(self.cluster.api_url, admin), retry_for_s=60)
        undo.callback(self.admin.close)
        self._seen = 0  # journal records already sorted into `records`
        self.records: dict[str, list[Record]] = {}  # job id -> its workers' journal, in arrival order

    # -- the journal and the store -------------------------------------------------------------------

    def of(self, job_id: str) -> list[Record]:
        """The job's journal so far."""
        fresh = self.journal.records[self._seen :]
        self._seen += len(fresh)
        for record in fresh:
            self.records.setdefault(record.job, []).append(record)
        return self.records.get(job_id, [])

    def wait(self, found: Callable[[], Any], until: float, tick: Callable[[], None] = lambda: None) -> Any:
        """`found()` once it is truthy, None after `until` (monotonic); keeps the components running
        meanwhile, as an orchestrator would, and calls `tick` every round."""
        while True:
            if result := found():
                return result
            if time.monotonic() > until:
                return None
            self.cluster.supervise()
            tick()
            time.sleep(0.05)

    def events(self, job_id: str) -> list[tuple[str, str | None, datetime]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(events.c.type, events.c.attempt_id, events.c.at)
                .where(events.c.job_id == job_id)
                .order_by(events.c.seq)
            ).all()
        return [(row.type, row.attempt_id, row.at) for row in rows]

    def job_state(self, job_id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()

    def epoch(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(leaders.c.epoch).where(leaders.c.name == "scheduler")).scalar() or 0
            )

    def worker_groups(self, attempt_id: str) -> list[int]:
        """The process groups of the attempt's workers: each rank's shim leads one (its worker in it)."""
        listing = json.loads((self.cluster.home / "attempts" / attempt_id / "workers.json").read_text())
        return [int(pid) for pid in listing["pids"]]

    def kill_workers(self, attempt_id: str) -> None:
        for group in self.worker_groups(attempt_id):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    # -- one measurement -----------------------------------------------------------------------------

    def submit(self, kind: str, number: int) -> str:
        key = f"resume-{kind.replace('_', '-')}-{number}-{uuid.uuid4().hex[:6]}"
        command = [sys.executable, str(WORKER), "--config", str(self.run / workload.RUNTIME_CONFIG)]
        spec = {
            "name": key,
            "team": workload.TEAM,
            "image": workload.IMAGE,
            "command": [*command, "--set", f"train.max_steps={MAX_STEPS}"],
            "env": {
                "FAULTS_JOURNAL": str(self.run / "journal.sock"),
                "FAULTS_DIR": str(self.run),
                "FAULTS_RUN": self.run.name,
            },
            "resources": {"gpus": self.ranks, "gpu_types": ["cpu"], "nodes": 1},
            "priority": "normal",
            "preemptible": True,
            "retry": {"max_failures": 2, "backoff": "1s"},
            "checkpoint": {
                "url": (self.run / "checkpoints" / workload.TEAM / key).as_uri(),
                "interval": "30s",
            },
        }
        return str(self.member.submit(spec, idempotency_key=key)["id"])

    def ready(self, job_id: str) -> Record:
        """The first beat of the job's rank 0 that carried a checkpoint: the attempt runs, and the store
        has its checkpoint (a relaunch resumes from it)."""
        beat = self.wait(
            lambda: next(
                (r for r in self.of(job_id) if r.e == "beat" and r.rank == 0 and r.data.get("checkpoint")),
                None,
            ),
            time.monotonic() + READY_S,
        )
        if beat is None:
            raise RuntimeError(
                f"job {job_id} has no checkpoint recorded after {READY_S:g}s (it is "
                f"{self.job_state(job_id)}): see the logs under {self.run} (--keep keeps them)"
            )
        return beat

    def measure(
        self, kind: str, number: int, repeat: int, give_up_s: float, leader_delay_s: float
    ) -> Measurement:
        # A relaunch must find two schedulers, one leading (the last leader loss's victim restarted).
        self.wait(lambda: self.cluster.leader(self.engine), time.monotonic() + 60)
        job_id = self.submit(kind, number)
        measured = Measurement(kind, number, job_id)
        beat = self.ready(job_id)
        old = beat.attempt
        at_step = max(r.data["step"] for r in self.of(job_id) if r.attempt == old and r.e == "step")
        offset = time.time() - time.monotonic()  # the store's stamps (wall clock) to monotonic time
        epoch, leader, new_lead = self.epoch(), self.cluster.leader(self.engine), None
        with contextlib.ExitStack() as interrupted:
            t0 = time.monotonic()
            if kind == "preempt":
                self.admin.preempt_attempt(old)
            elif kind in ("crash", "leader_loss"):
                self.kill_workers(old)
            elif kind == "node_loss":
                frozen = interrupted.enter_context(Frozen(self.worker_groups(old)))
                measured.notes.append(f"{len(frozen.pids)} processes frozen ({frozen.how})")
            if kind == "leader_loss":
                delay = leader_delay_s * (number - 1) / max(1, repeat - 1)
                time.sleep(max(0.0, t0 + delay - time.monotonic()))
                self.cluster.kill(leader or "scheduler-1")
                measured.notes.append(f"{leader} (leading) killed at +{time.monotonic() - t0:.2f}")

            def lead() -> None:
                nonlocal new_lead
                if kind == "leader_loss" and new_lead is None and self.epoch() != epoch:
                    new_lead = time.monotonic() - t0

            first = self.wait(
                lambda: next(
                    (r for r in self.of(job_id) if r.e == "step" and r.rank == 0 and r.attempt != old), None
                ),
                t0 + give_up_s,
                tick=lead,
            )
            if first is None:
                measured.notes.append(f"not within {give_up_s:g}s: " + self.why_not(old, t0, offset))
        if first is not None:
            measured.total_s = first.t - t0
            self.breakdown(measured, old, first, t0, offset)
            resumed = next(
                (r for r in self.of(job_id) if r.attempt == first.attempt and r.e == "resume"), None
            )
            since = resumed.data["step"] if resumed else "?"
            measured.notes.append(f"interrupted at step {at_step}, resumed from step {since}")
        if new_lead is not None:
            measured.notes.append(f"new lead seen at +{new_lead:.2f}")
        elif kind == "leader_loss":
            measured.notes.append("resumed before a new lead: the killed leader had relaunched it")
        self.finish(job_id)
        return measured

    def breakdown(self, measured: Measurement, old: str, first: Record, t0: float, offset: float) -> None:
        """Each phase from the old attempt's end (store) to the new one's first step (journal)."""
        found = self.events(measured.job_id)

        def at(kinds: set[str], attempt: str) -> float | None:
            when = next((at for kind, a, at in found if kind in kinds and a == attempt), None)
            return None if when is None else when.timestamp() - offset

        def mark(event: str) -> float | None:
            return next(
                (
                    r.t
                    for r in self.records[measured.job_id]
                    if r.attempt == first.attempt and r.rank == 0 and r.e == event
                ),
                None,
            )

        ended, reserved = at(ENDINGS, old), at({"job.scheduled"}, first.attempt)
        worker = [mark(e) for e in ("start", "imported", "joined", "restore_began", "restored")]
        marks = [t0, ended, reserved, *worker, first.t]
        for phase, (a, b) in zip(PHASES, itertools.pairwise(marks), strict=True):
            if a is not None and b is not None:
                measured.phases[phase] = b - a
        ending = next((kind for kind, a, _ in found if kind in ENDINGS and a == old), "?")
        between = sorted({a for _, a, _ in found if a not in (None, old, first.attempt)})
        measured.notes.append(f"old attempt {ending.removeprefix('attempt.')}")
        if between:
            measured.notes.append(f"attempts in between: {', '.join(between)}")
        exited = next((r for r in self.records[measured.job_id] if r.attempt == old and r.e == "exit"), None)
        if exited is not None:
            measured.notes.append(f"old worker exited {exited.data.get('code')} at +{exited.t - t0:.2f}")
        # The shims write each rank's status once its process is gone (their mtime: the wall clock).
        statuses = list((self.cluster.home / "attempts" / old).glob("rank*.exit"))
        if statuses and len(statuses) == self.ranks:
            gone = max(path.stat().st_mtime for path in statuses) - offset
            measured.notes.append(f"its processes gone at +{gone - t0:.2f}")
        missing = [p for p in PHASES if p not in measured.phases]
        if missing:
            measured.notes.append(f"phases not measured: {', '.join(missing)}")

    def why_not(self, old: str, t0: float, offset: float) -> str:
        """What the store says of an attempt not replaced in time: its state, last beat and lease."""
        with self.engine.connect() as conn:
            row = conn.execute(select(attempts).where(attempts.c.id == old)).first()
        if row is None:
            return "its attempt is gone from the store"

        def since(when: datetime | None) -> float | None:
            return None if when is None else when.timestamp() - offset - t0

        beat, lease = since(row.heartbeat_at), since(row.lease_expires_at)
        said = [f"old attempt {row.state}"]
        said += [f"its last heartbeat at {beat:+.1f} s"] if beat is not None else ["no heartbeat"]
        if lease is not None:
            said.append(f"its lease until {lease:+.1f} s")
            if lease > self.lease_s + 1:  # a beat before t0 gives at most a lease: someone renewed it since
                said[-1] += (
                    " (renewed after the interruption: by the launcher, which sees its processes alive)"
                )
        return ", ".join(said)

    def finish(self, job_id: str) -> None:
        """Cancel the job and wait until it ended and its workers are gone: the next measurement has the
        machine to itself."""
        with contextlib.suppress(Exception):  # already final: nothing to cancel
            self.member.cancel(job_id)
        settled = self.wait(
            lambda: self.job_state(job_id) in FINAL_JOB_STATES and not labelled("FAULTS_RUN", self.run.name),
            time.monotonic() + SETTLE_S,
        )
        if not settled:
            log(f"  job {job_id} not ended after {SETTLE_S:g}s of its cancel: its workers killed")
            _kill_leftovers(self.run)


def _kill_leftovers(run: Path) -> None:
    for pids in labelled("FAULTS_RUN", run.name).values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- the report -----------------------------------------------------------------------------------------


def p99(values: list[float]) -> float:
    """Nearest rank: under 100 values, the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def report(measurements: list[Measurement], lease_s: float) -> str:
    spans = [m.phases["restore"] for m in measurements if "restore" in m.phases]
    restore_s = statistics.median(spans) if spans else math.nan
    goals = {"preempt": restore_s + 10, "crash": restore_s + 10}
    goals |= {"node_loss": lease_s + restore_s + 15, "leader_loss": lease_s + restore_s + 15}
    lines = [f"{'kind':<12} {'runs':>4} {'p50_s':>7} {'p99_s':>7} {'goal_s':>7}   median per phase (s)"]
    figures: dict[str, float] = {}
    for kind in KINDS:
        runs = [m for m in measurements if m.kind == kind]
        done = [m.total_s for m in runs if m.total_s is not None]
        if not runs:
            figures[kind] = math.nan
            continue
        figures[kind] = p99(done) if len(done) == len(runs) else math.inf
        p50 = statistics.median(done) if done else math.inf
        medians = {
            p: statistics.median(v) for p in PHASES if (v := [m.phases[p] for m in runs if p in m.phases])
        }
        split = " | ".join(f"{p} {s:.2f}" for p, s in medians.items())
        lines.append(
            f"{kind:<12} {len(runs):>4} {p50:>7.2f} {figures[kind]:>7.2f} {goals[kind]:>7.2f}   {split}"
            + (f"   ({len(runs) - len(done)} not resumed)" if len(done) < len(runs) else "")
        )
        if figures[kind] > goals[kind] and medians:
            top = sorted(medians.items(), key=lambda item: -item[1])[:2]
            lines.append(
                f"  {kind} over its goal by {figures[kind] - goals[kind]:.2f} s; most time in "
                + ", then ".join(f"{p} ({s:.2f} s median)" for p, s in top)
            )
        if missed := next((m for m in runs if m.total_s is None), None):
            lines.append(f"  {kind} not resumed: " + "; ".join(missed.notes))
    result = " ".join(f"{kind}_p99_s={figures[kind]:.2f}" for kind in KINDS)
    lines.append(f"RESULT {result} lease_s={lease_s:g} restore_s={restore_s:.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="interruptions of each kind [5]")
    parser.add_argument("--lease", type=float, default=10.0, help="lease_seconds of the control plane [10]")
    parser.add_argument(
        "--ranks", type=int, choices=(1, 2), default=2, help="workers of the job, on one node [2]"
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"which, comma-separated [{','.join(KINDS)}]"
    )
    parser.add_argument("--give-up", type=float, default=60.0, help="seconds to wait for a resume [60]")
    parser.add_argument(
        "--leader-delay",
        type=float,
        default=0.5,
        help="leader_loss: the leader dies 0 to this long after the crash [0.5]",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the run directory (logs, journal) at the end"
    )
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: some of {', '.join(KINDS)}")
    if args.repeat < 1 or args.lease <= 0 or args.give_up <= 0 or args.leader_delay < 0:
        parser.error("--repeat, --lease and --give-up must be positive, --leader-delay not negative")
    # SIGTERM unwinds like Ctrl-C: everything started is stopped, the run directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    run = Path(tempfile.mkdtemp(prefix="gpuyard-resume-"))
    measurements: list[Measurement] = []
    try:
        with contextlib.ExitStack() as undo:
            log(f"starting PostgreSQL, Redis and the control plane (lease {args.lease:g} s) in {run}")
            bench = Bench(run, args.lease, args.ranks, undo)
            log(f"control plane up after {time.monotonic() - started:.0f} s")
            for number in range(1, args.repeat + 1):  # kinds in turn: a slow spell of the machine hits all
                for kind in kinds:
                    measured = bench.measure(kind, number, args.repeat, args.give_up, args.leader_delay)
                    measurements.append(measured)
                    log(measured.line(args.repeat))
    finally:
        if args.keep:
            log(f"run directory kept: {run}")
        else:
            shutil.rmtree(run, ignore_errors=True)
    print(report(measurements, args.lease), flush=True)
    log(f"{len(measurements)} interruptions in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
