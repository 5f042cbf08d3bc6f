"""Time to resume: how long a running training job is away when it is interrupted, from the moment of
the interruption to its first training step after the restore, in the new attempt.

The control plane runs as production runs it, as real processes: `gpuyard api` (2 workers), `gpuyard
relay` and two `gpuyard scheduler` replicas on a throwaway PostgreSQL and Redis of the benchmark's
own, with one of two launchers (`--launcher`):

- `local` (the default; tests/faults/cluster.py): a fleet of 4 GPUs (two nodes of 2) in a fleet file,
  the workers this machine's processes, each under the launcher's shim;
- `kubernetes`: the emulated cluster of docs/kubernetes.md ("The emulated cluster", deploy/local), as
  `make demo-production` runs it (`local_cluster.control_plane.on_cluster`): 3 nodes of 2 GPUs (H100
  labels, CPU underneath) whose agents run each pod as real processes in namespaces of its own, the
  team's namespace applied from `gpuyard kubernetes namespaces`, checkpoints in an S3 endpoint (moto's
  server) that the pods reach with their team's object-store Secret. A pod is one process per node
  that starts the node's ranks itself (training/ranks.py).

The job is `--ranks` (2: a DDP gang on one node), so a relaunch never queues: there is always a free
node. It is the real training runtime (`python -m training.run`, DDP on gloo, DCP checkpoints every 5
steps, heartbeats every second) on the fault suite's tiny model, run by `resume_worker.py`, which
journals (on this machine's monotonic clock, which the pods share) what the runtime does: its start,
its restore, each step.

Each measurement submits a fresh job, waits until its first attempt runs and the store has recorded
a checkpoint, interrupts it one way, and waits for the first step of the attempt that resumes it:

- `preempt`: `POST /v1/attempts/{id}/preempt` (the admin's eviction: SIGTERM, save, exit 75; on
  Kubernetes the pod deleted with its grace period, its agent's SIGTERM);
- `crash`: every process of the attempt's workers SIGKILLed, shims included (the fault suite's
  kill-worker); on Kubernetes, each pod's container (its process group: the runtime and its ranks);
- `node_loss`: a silent node loss, which only the lease tells. Local: every process of the attempt
  frozen (the cgroup freezer, else SIGSTOP). The local launcher still sees them alive and the
  scheduler renews their lease, so it is never resumed (`inf`): nothing on one machine tells a frozen
  worker from a slow one. Kubernetes: the node is lost (`NodeAgent.lose`, as the demo and
  tests/kubernetes/test_production.py lose one): its agent stops reporting and its pods' processes
  die with it, so neither the node nor the workers say anything more (a frozen node would be the
  same to the platform: no exit, no heartbeat, no status; a dead one is what a machine that fails
  does). Its pods stay Running in the API, so the launcher sees them alive, and the scheduler renews
  their lease, until the node lifecycle controller marks the node NotReady (`--node-grace` s without
  a report; kube-controller-manager's node-monitor grace period, 40 or 50 s by default on a real
  cluster): the lease runs out a lease after the last renewal before that (2026-12-06, lease 10 s,
  grace 5 s: NotReady seen at +3.4 to +5.2 s, the attempt LOST at +14.3 to +14.6 s). After each,
  the lost node is removed (its pods force-deleted, as an operator's `kubectl delete node`) and a
  fresh one joins;
- `leader_loss`: a crash, then the leading scheduler SIGKILLed 0 to `--leader-delay` s later (spread
  evenly over the repeats: the leader relaunches a crashed attempt within about 0.3 s here, so the
  kill lands before, during or just after its recovery), and the standby takes over after the leader
  lease (lease / 2); killed components are restarted as a Deployment would.

Each interruption prints one line on stderr: the time to resume and where it went, phase by phase
(they add up to it), from the store's events and rank 0's journal: `end` (the interruption until
the store has the old attempt's end: detection, and for a preemption the signal, the save and the
exit), `place` (until the job's next attempt is reserved), `launch` (until that worker's Python runs:
the claim, the shim, the interpreter; on Kubernetes the attempt's objects created, the pod bound and
started, until its process runs), `node` (Kubernetes, a pod of several ranks: its process starts
the ranks, importing no torch, until rank 0's Python runs), `import` (torch and the
runtime), `join` (the config and the ranks' rendezvous), `setup` (data, model, DDP wrap, until the
restore begins), `restore` (the worker's own restore span: checkpoint chosen, verified and loaded) and
`step` (until its first step). Store events are stamped with the database's clock, converted to this
machine's monotonic clock. A job not resumed within `--give-up` gets what the store says of its old
attempt instead (its state, last heartbeat and lease). Then, on stdout, per kind p50 and p99 (the
largest value under 100 runs), each phase's median, the goals, and

    RESULT preempt_p99_s=A crash_p99_s=B node_loss_p99_s=C leader_loss_p99_s=D lease_s=L restore_s=R

with R the median restore span; `inf`: a kind not resumed within `--give-up` s at least once, `nan`:
not run. Goals: A and B <= R + 10 s; C and D <= L + R + 15 s. Both launchers' figures, and where
their time goes: docs/system-design.md, section 2 ("Time to resume").

    python benchmarks/time_to_resume.py [--launcher local|kubernetes] [--repeat 5] [--lease 10]
        [--kinds preempt,crash,...] [--node-grace 5]
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
from collections.abc import Callable, Sequence
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
from gpuyard.clock import utcnow  # noqa: E402
from gpuyard.domain.feasibility import TeamQuota  # noqa: E402
from gpuyard.store import teams as team_store  # noqa: E402
from gpuyard.store.db import migrate  # noqa: E402
from gpuyard.store.tables import attempts, events, jobs, leaders  # noqa: E402
from gpuyard_client import Endpoint, GpuyardClient  # noqa: E402
from harness import free_port, log  # noqa: E402
from local_cluster.agent import H100, NodeSpec  # noqa: E402
from local_cluster.cluster import EmulatedCluster  # noqa: E402
from local_cluster.control_plane import object_store_secret, on_cluster  # noqa: E402
from local_cluster.images import python_image, repository  # noqa: E402
from local_cluster.services import S3Server  # noqa: E402
from sqlalchemy import Engine, create_engine, select  # noqa: E402

KINDS = ("preempt", "crash", "node_loss", "leader_loss")
PHASES = ("end", "place", "launch", "node", "import", "join", "setup", "restore", "step")
ENDINGS = {f"attempt.{s}" for s in ("succeeded", "failed", "preempted", "lost", "cancelled")}
WORKER = Path(__file__).parent / "resume_worker.py"
MAX_STEPS = 10**6  # never reached: every job is cancelled once measured
READY_S = 300.0  # the longest wait for a fresh job to run and have a checkpoint recorded (torch on 2 cores)
SETTLE_S = 60.0  # the longest wait for a cancelled job to end and its workers to be gone
NODES = 3  # Kubernetes: the job's node and two spare ones


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


def phase_marks(
    t0: float,
    ended: float | None,
    reserved: float | None,
    node_start: float | None,
    worker: Sequence[float | None],
    first_step: float,
) -> dict[str, float]:
    """Each phase's length from the moments that end them (monotonic; None: not seen): the
    interruption, the old attempt's end, the new one's reservation, its pod's process (Kubernetes, a
    pod of several ranks; else None), rank 0's `start`, `imported`, `joined`, `restore_began` and
    `restored`, its first step. A phase whose either end was not seen is left out."""
    marks: list[tuple[str, float | None]] = [("", t0), ("end", ended), ("place", reserved)]
    if node_start is not None:
        marks.append(("launch", node_start))
    launched, imported, joined, restoring, restored = worker
    marks += [("node" if node_start is not None else "launch", launched), ("import", imported)]
    marks += [("join", joined), ("setup", restoring), ("restore", restored), ("step", first_step)]
    return {
        phase: b - a for (_, a), (phase, b) in itertools.pairwise(marks) if a is not None and b is not None
    }


def leading(engine: Engine, schedulers: dict[str, int | None]) -> str | None:
    """Which of the scheduler replicas (name -> pid, None when not running) holds the leader lease
    (the store's row names the holder's pid)."""
    with engine.connect() as conn:
        holder = conn.execute(select(leaders.c.holder).where(leaders.c.name == "scheduler")).scalar()
    if holder is None:
        return None
    return next((name for name, pid in schedulers.items() if pid is not None and f":{pid}:" in holder), None)


class Bench:
    """The servers, the control plane, the journal and two API clients, each undone by `undo`; one
    measurement. What the launchers do differently is a subclass's (`LocalBench`, `KubernetesBench`):
    starting the control plane, the job's image, resources and checkpoint store, the workers' process
    groups, a node's loss, a component's kill and restart."""

    # Who renews a silent attempt's lease while its workers' processes are there, as why_not says it.
    renewer = "the launcher"

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
        migrate(self.engine)
        with self.engine.begin() as conn:
            now = utcnow()
            team_store.ensure_team(conn, workload.TEAM, TeamQuota(gpu_quota=64, max_gpus_per_job=4), now)
            member = team_store.create_token(conn, workload.TEAM, team_store.Role.MEMBER, now, "resume")
            admin = team_store.create_token(
                conn, workload.TEAM, team_store.Role.PLATFORM_ADMIN, now, "preempt"
            )
        api_url = self.start(undo, postgres.url(), redis_server.url)
        self.member = GpuyardClient(Endpoint(api_url, member), retry_for_s=60)
        undo.callback(self.member.close)
        self.admin = GpuyardClient(Endpoint(api_url, admin), retry_for_s=60)
        undo.callback(self.admin.close)
        self._seen = 0  # journal records already sorted into `records`
        self.records: dict[str, list[Record]] = {}  # job id -> its workers' journal, in arrival order

    # -- what the launchers do differently -----------------------------------------------------------

    def start(self, undo: contextlib.ExitStack, database_url: str, redis_url: str) -> str:
        """Start the control plane (its stop registered with `undo`) on the migrated store, the team
        in it; the API's URL."""
        raise NotImplementedError

    def job(self, key: str) -> dict[str, Any]:
        """The job's image, resources and checkpoint (the spec's launcher-specific part)."""
        raise NotImplementedError

    def supervise(self) -> None:
        """Restart every component that exited, as an orchestrator would."""
        raise NotImplementedError

    def leader(self) -> str | None:
        """The scheduler replica that leads, if one runs and leads."""
        raise NotImplementedError

    def kill(self, name: str) -> None:
        """SIGKILL a component."""
        raise NotImplementedError

    def worker_groups(self, attempt_id: str) -> list[int]:
        """The process groups of the attempt's workers (a crash SIGKILLs them)."""
        raise NotImplementedError

    def lose(self, attempt_id: str, groups: list[int], interrupted: contextlib.ExitStack) -> str:
        """The silent loss of the attempt's node, undone (where it can be) by `interrupted`; a note."""
        raise NotImplementedError

    def watch(self, t0: float) -> None:
        """Called every round while a resume is awaited."""

    def watched(self, old: str, t0: float, offset: float) -> list[str]:
        """Notes on what became of the old attempt's workers, once the resume was seen or given up."""
        return []

    def after(self) -> None:
        """Once a measurement's job ended: make the platform whole again for the next one."""

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
            self.supervise()
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

    # -- one measurement -----------------------------------------------------------------------------

    def submit(self, kind: str, number: int) -> str:
        key = f"resume-{kind.replace('_', '-')}-{number}-{uuid.uuid4().hex[:6]}"
        command = [sys.executable, str(WORKER), "--config", str(self.run / workload.RUNTIME_CONFIG)]
        spec = {
            "name": key,
            "team": workload.TEAM,
            "command": [*command, "--set", f"train.max_steps={MAX_STEPS}"],
            "env": {
                "FAULTS_JOURNAL": str(self.run / "journal.sock"),
                "FAULTS_DIR": str(self.run),
                "FAULTS_RUN": self.run.name,
            },
            "priority": "normal",
            "preemptible": True,
            "retry": {"max_failures": 2, "backoff": "1s"},
            **self.job(key),
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
        self.wait(self.leader, time.monotonic() + 60)
        job_id = self.submit(kind, number)
        measured = Measurement(kind, number, job_id)
        beat = self.ready(job_id)
        old = beat.attempt
        at_step = max(r.data["step"] for r in self.of(job_id) if r.attempt == old and r.e == "step")
        offset = time.time() - time.monotonic()  # the store's stamps (wall clock) to monotonic time
        epoch, leader, new_lead = self.epoch(), self.leader(), None
        groups = self.worker_groups(old)  # found before the clock starts: the interruption is the signal
        with contextlib.ExitStack() as interrupted:
            t0 = time.monotonic()
            if kind == "preempt":
                self.admin.preempt_attempt(old)
            elif kind in ("crash", "leader_loss"):
                for group in groups:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
            elif kind == "node_loss":
                measured.notes.append(self.lose(old, groups, interrupted))
            if kind == "leader_loss":
                delay = leader_delay_s * (number - 1) / max(1, repeat - 1)
                time.sleep(max(0.0, t0 + delay - time.monotonic()))
                self.kill(leader or "scheduler-1")
                measured.notes.append(f"{leader} (leading) killed at +{time.monotonic() - t0:.2f}")

            def tick() -> None:
                nonlocal new_lead
                if kind == "leader_loss" and new_lead is None and self.epoch() != epoch:
                    new_lead = time.monotonic() - t0
                self.watch(t0)

            first = self.wait(
                lambda: next(
                    (r for r in self.of(job_id) if r.e == "step" and r.rank == 0 and r.attempt != old), None
                ),
                t0 + give_up_s,
                tick=tick,
            )
            measured.notes += self.watched(old, t0, offset)
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
        self.after()
        return measured

    def breakdown(self, measured: Measurement, old: str, first: Record, t0: float, offset: float) -> None:
        """Each phase from the old attempt's end (store) to the new one's first step (journal)."""
        found = self.events(measured.job_id)

        def at(kinds: set[str], attempt: str) -> float | None:
            when = next((at for kind, a, at in found if kind in kinds and a == attempt), None)
            return None if when is None else when.timestamp() - offset

        def mark(event: str, rank: int = 0) -> float | None:
            return next(
                (
                    r.t
                    for r in self.records[measured.job_id]
                    if r.attempt == first.attempt and r.rank == rank and r.e == event
                ),
                None,
            )

        ended, reserved, node_start = (
            at(ENDINGS, old),
            at({"job.scheduled"}, first.attempt),
            mark("start", -1),
        )
        worker = [mark(e) for e in ("start", "imported", "joined", "restore_began", "restored")]
        measured.phases = phase_marks(t0, ended, reserved, node_start, worker, first.t)
        if node_start is not None and (node_imported := mark("imported", -1)) is not None:
            measured.notes.append(
                f"the pod's process imported torch and the runtime in {node_imported - node_start:.2f} s"
            )
        ending = next((kind for kind, a, _ in found if kind in ENDINGS and a == old), "?")
        between = sorted({a for _, a, _ in found if a not in (None, old, first.attempt)})
        measured.notes.append(f"old attempt {ending.removeprefix('attempt.')}")
        if ending == "attempt.lost":
            measured.notes += self.lease_notes(old, t0, offset)[1:]
        if between:
            measured.notes.append(f"attempts in between: {', '.join(between)}")
        exited = next((r for r in self.records[measured.job_id] if r.attempt == old and r.e == "exit"), None)
        if exited is not None:
            measured.notes.append(f"old worker exited {exited.data.get('code')} at +{exited.t - t0:.2f}")
        missing = [p for p in PHASES if p not in measured.phases and (p != "node" or node_start is not None)]
        if missing:
            measured.notes.append(f"phases not measured: {', '.join(missing)}")

    def lease_notes(self, old: str, t0: float, offset: float) -> list[str]:
        """What the store says of an attempt: its state, last heartbeat and lease, from `t0`."""
        with self.engine.connect() as conn:
            row = conn.execute(select(attempts).where(attempts.c.id == old)).first()
        if row is None:
            return ["its attempt is gone from the store"]

        def since(when: datetime | None) -> float | None:
            return None if when is None else when.timestamp() - offset - t0

        beat, lease = since(row.heartbeat_at), since(row.lease_expires_at)
        said = [f"old attempt {row.state}"]
        said += [f"its last heartbeat at {beat:+.1f} s"] if beat is not None else ["no heartbeat"]
        if lease is not None:
            said.append(f"its lease until {lease:+.1f} s")
            if lease > self.lease_s + 1:  # a beat before t0 gives at most a lease: someone renewed it since
                said[-1] += f" (renewed after the interruption: by {self.renewer})"
        return said

    def why_not(self, old: str, t0: float, offset: float) -> str:
        """What the store says of an attempt not replaced in time: its state, last beat and lease."""
        return ", ".join(self.lease_notes(old, t0, offset))

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


class LocalBench(Bench):
    """The local launcher (tests/faults/cluster.py): a fleet of two nodes of 2 GPUs in its file."""

    renewer = "the launcher, which sees its processes alive"

    def start(self, undo: contextlib.ExitStack, database_url: str, redis_url: str) -> str:
        self.cluster = Cluster(
            self.run,
            database_url=database_url,
            redis_url=redis_url,
            api_port=free_port(),
            lease_s=self.lease_s,
        )
        undo.callback(self.cluster.stop)
        self.cluster.start(self.engine)
        return self.cluster.api_url

    def job(self, key: str) -> dict[str, Any]:
        return {
            "image": workload.IMAGE,
            "resources": {"gpus": self.ranks, "gpu_types": ["cpu"], "nodes": 1},
            "checkpoint": {
                "url": (self.run / "checkpoints" / workload.TEAM / key).as_uri(),
                "interval": "30s",
            },
        }

    def supervise(self) -> None:
        self.cluster.supervise()

    def leader(self) -> str | None:
        return self.cluster.leader(self.engine)

    def kill(self, name: str) -> None:
        self.cluster.kill(name)

    def worker_groups(self, attempt_id: str) -> list[int]:
        """Each rank's shim leads one (its worker in it)."""
        listing = json.loads((self.cluster.home / "attempts" / attempt_id / "workers.json").read_text())
        return [int(pid) for pid in listing["pids"]]

    def lose(self, attempt_id: str, groups: list[int], interrupted: contextlib.ExitStack) -> str:
        frozen = interrupted.enter_context(Frozen(groups))
        return f"{len(frozen.pids)} processes frozen ({frozen.how})"

    def watched(self, old: str, t0: float, offset: float) -> list[str]:
        # The shims write each rank's status once its process is gone (their mtime: the wall clock).
        statuses = list((self.cluster.home / "attempts" / old).glob("rank*.exit"))
        if not statuses or len(statuses) != self.ranks:
            return []
        gone = max(path.stat().st_mtime for path in statuses) - offset
        return [f"its processes gone at +{gone - t0:.2f}"]


class KubernetesBench(Bench):
    """The Kubernetes launcher on the emulated cluster (deploy/local), as `make demo-production` runs
    it: `NODES` nodes of 2 GPUs (H100 labels, CPU underneath), the control plane's processes from
    `local_cluster.control_plane.on_cluster`, checkpoints in an S3 endpoint (moto's server)."""

    renewer = "the scheduler: the launcher sees its pods run on a Ready node"

    def __init__(
        self, run: Path, lease_s: float, ranks: int, undo: contextlib.ExitStack, node_grace_s: float
    ):
        self.node_grace_s = node_grace_s
        self.nodes = itertools.count(1)  # gpu-1, gpu-2, ...: a replacement takes the next name
        self.lost: str | None = None  # the node the current node_loss lost
        self.not_ready_at: float | None = None  # when it was first seen not Ready, from t0
        self.looked = 0.0  # when it was last looked at (monotonic)
        super().__init__(run, lease_s, ranks, undo)

    def node(self) -> NodeSpec:
        """The next node: its agent mounts the run directory (the workers' config, data, journal and
        work folders) as every node of a cluster mounts its shared file system."""
        return NodeSpec(
            f"gpu-{next(self.nodes)}", gpus=2, cpu="8", memory="32Gi", labels=H100, shared=(str(self.run),)
        )

    def start(self, undo: contextlib.ExitStack, database_url: str, redis_url: str) -> str:
        # The pods run as their own user (10001): it sends to the journal and writes its work folder.
        os.chmod(self.run / "journal.sock", 0o777)
        (self.run / "runtime").mkdir()
        os.chmod(self.run / "runtime", 0o777)
        image = python_image(sources=(str(ROOT),))  # this machine's Python and the checkout
        self.cluster = undo.enter_context(
            EmulatedCluster(
                [self.node() for _ in range(NODES)],
                {repository(workload.IMAGE): image},
                self.run / "nodes",
                node_grace_s=self.node_grace_s,
            )
        )
        s3 = S3Server(host=self.cluster.gateway).start()
        undo.callback(s3.stop)
        self.checkpoints = s3.create_bucket("checkpoints")
        outside = {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "PROMETHEUS_"))}
        self.plane = on_cluster(
            self.cluster,
            s3,
            self.run / "gpuyard",
            # As the local launcher's control plane has them (tests/faults/cluster.py).
            outside
            | {
                "GPUYARD_BUS_TIMEOUT_SECONDS": f"{max(0.5, self.lease_s / 12):g}",
                "GPUYARD_DB_POOL_SIZE": "6",
            },
            database_url=database_url,
            redis_url=redis_url,
            lease_s=self.lease_s,
            grace_s=5,
            checkpoint_store=self.checkpoints,
            stream="time-to-resume",
        )
        undo.callback(self.plane.stop)
        applied = self.plane.apply_namespaces(self.cluster.server.emulator, self.cluster.api)
        secrets = [
            object_store_secret(d["metadata"]["name"], s3) for d in applied if d["kind"] == "Namespace"
        ]
        self.cluster.server.emulator.apply(self.cluster.api.api_client, secrets)
        self.plane.up()
        return self.plane.url

    def job(self, key: str) -> dict[str, Any]:
        return {
            "image": workload.IMAGE,
            "resources": {"gpus": self.ranks, "gpu_types": ["h100"], "nodes": 1},
            "checkpoint": {"url": f"{self.checkpoints}/{workload.TEAM}/{key}", "interval": "30s"},
        }

    def supervise(self) -> None:
        self.plane.supervise()

    def leader(self) -> str | None:
        schedulers = {
            name: process.pid if process.poll() is None else None
            for name, process in self.plane.processes.items()
            if name in self.plane.schedulers
        }
        return leading(self.engine, schedulers)

    def kill(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.plane.processes[name].kill()

    def worker_groups(self, attempt_id: str) -> list[int]:
        """The process group of each of the attempt's pods: its container's (the agent starts it in a
        session of its own), which the runtime's ranks share."""
        groups = set()
        for pid in labelled("GPUYARD_ATTEMPT_ID", attempt_id).get(attempt_id, []):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        if not groups:
            raise RuntimeError(f"no process of attempt {attempt_id} runs")
        return sorted(groups)

    def lose(self, attempt_id: str, groups: list[int], interrupted: contextlib.ExitStack) -> str:
        """Its node is gone (`NodeAgent.lose`): the pods' processes die with it, and nothing reports
        it, neither the agent nor the workers."""
        with self.engine.connect() as conn:
            placement = conn.execute(
                select(attempts.c.placement).where(attempts.c.id == attempt_id)
            ).scalar_one()
        (self.lost,) = {node["node"] for node in placement["nodes"]}
        self.not_ready_at, self.looked = None, 0.0
        self.cluster.agents[self.lost].lose()
        return f"node {self.lost} lost"

    def watch(self, t0: float) -> None:
        """When the lost node is first seen not Ready (looked at every 0.25 s)."""
        now = time.monotonic()
        if self.lost is None or self.not_ready_at is not None or now - self.looked < 0.25:
            return
        self.looked = now
        conditions = self.cluster.api.read_node(self.lost).status.conditions or []
        if not any(c.type == "Ready" and c.status == "True" for c in conditions):
            self.not_ready_at = time.monotonic() - t0

    def watched(self, old: str, t0: float, offset: float) -> list[str]:
        if self.lost is None:
            return []
        if self.not_ready_at is None:
            return [f"node {self.lost} still Ready"]
        return [
            f"node {self.lost} not Ready at +{self.not_ready_at:.2f} (node grace {self.node_grace_s:g} s)"
        ]

    def after(self) -> None:
        """A lost node is removed (the operator's word that the machine is gone: its pods are
        force-deleted) and a fresh one joins: spare nodes for the next measurement."""
        if self.lost is not None:
            self.cluster.api.delete_node(self.lost)
            self.cluster.add_node(self.node())
            self.lost = None


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
    parser.add_argument(
        "--launcher", choices=("local", "kubernetes"), default="local", help="the control plane's [local]"
    )
    parser.add_argument("--repeat", type=int, default=5, help="interruptions of each kind [5]")
    parser.add_argument("--lease", type=float, default=10.0, help="lease_seconds of the control plane [10]")
    parser.add_argument(
        "--ranks", type=int, choices=(1, 2), default=2, help="workers of the job, on one node [2]"
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"which, comma-separated [{','.join(KINDS)}]"
    )
    parser.add_argument("--give-up", type=float, help="seconds to wait for a resume [60; kubernetes: 120]")
    parser.add_argument(
        "--leader-delay",
        type=float,
        default=0.5,
        help="leader_loss: the leader dies 0 to this long after the crash [0.5]",
    )
    parser.add_argument(
        "--node-grace",
        type=float,
        default=5.0,
        help="kubernetes: seconds without a report until a node is NotReady [5]",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the run directory (logs, journal) at the end"
    )
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: some of {', '.join(KINDS)}")
    if args.give_up is None:
        args.give_up = 120.0 if args.launcher == "kubernetes" else 60.0
    if min(args.repeat, args.lease, args.give_up, args.node_grace) <= 0 or args.leader_delay < 0:
        parser.error(
            "--repeat, --lease, --give-up and --node-grace must be positive, --leader-delay not negative"
        )
    # SIGTERM unwinds like Ctrl-C: everything started is stopped, the run directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    run = Path(tempfile.mkdtemp(prefix="gpuyard-resume-"))
    measurements: list[Measurement] = []
    try:
        with contextlib.ExitStack() as undo:
            log(
                f"starting PostgreSQL, Redis and the control plane ({args.launcher} launcher, lease "
                f"{args.lease:g} s) in {run}"
            )
            bench: Bench = (
                KubernetesBench(run, args.lease, args.ranks, undo, args.node_grace)
                if args.launcher == "kubernetes"
                else LocalBench(run, args.lease, args.ranks, undo)
            )
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
