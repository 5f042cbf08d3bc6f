"""One fault campaign: start PostgreSQL, Redis, their fault links and the control plane; submit a
stream of jobs while faults strike at random moments; heal everything; wait for quiescence (every
job final, no attempt live, no worker process left); check the invariants over the whole history;
tear everything down. Everything it runs is its own: it never touches the machine's servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.store import teams as team_store
from gpuyard.store.db import migrate
from gpuyard.store.tables import jobs
from servers import free_port
from sqlalchemy import Engine, create_engine, func, select

from . import workload
from .backends import Postgres, Redis, SmallDisk
from .cluster import COMPONENTS, Cluster, labelled
from .faults import FAULTS, Injector, Target
from .history import (
    FINAL_JOB_STATES,
    History,
    JournalCollector,
    read_exit_times,
    read_exits,
    read_store,
    read_verdict_times,
)
from .invariants import Violation, check
from .kubernetes import KUBERNETES_FAULTS, Pods
from .network import Network
from .pausing import thaw_all
from .proxy import FaultProxy
from .stacks import describe

STREAM = "gpuyard:events"  # the settings' default: the relay publishes there
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Campaign:
    seed: int
    fault_s: float = 75.0  # how long faults strike while jobs arrive
    min_faults: int = 0  # ... and past it (at most as long again) until this many struck
    rate_per_s: float = 0.4  # job arrivals
    min_jobs: int = 0  # ... and at least this many, a sparser draw topped up
    lease_s: float = 10.0
    quiesce_s: float = 240.0  # the longest wait for every job to end once the faults stop
    stall_s: float = 45.0  # ... and the longest without progress (a job ending, a worker's record)
    launcher: str = "local"  # or "kubernetes": the workers run in the emulated cluster's pods


@dataclass
class Report:
    campaign: Campaign
    run: Path
    injected: Counter[str] = field(default_factory=Counter)
    jobs: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    quiesced_s: float | None = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations and not self.rejected

    def render(self) -> str:
        c = self.campaign
        settled = (
            f"quiescent {self.quiesced_s:.0f}s after" if self.quiesced_s is not None else "NOT quiescent"
        )
        lines = [
            f"fault campaign seed {c.seed}: {c.fault_s:g}s of faults, {self.wall_s:.0f}s in all, "
            f"{settled} the faults stopped; run directory {self.run}",
            f"  faults injected ({sum(self.injected.values())}): {_counts(self.injected)}",
            f"  components restarted: {_counts(self.restarts) or 'none'}",
            f"  jobs ({sum(self.jobs.values())}): {_counts(self.jobs)}",
            f"  attempts ({sum(self.attempts.values())}): {_counts(self.attempts)}",
            f"  invariant violations: {len(self.violations)}",
            *(f"    {v}" for v in self.violations),
            *(f"  refused submission: {r}" for r in self.rejected),
            f"  replay: python -m tests.faults.run --seed {c.seed} --campaigns 1 "
            f"--fault-seconds {c.fault_s:g} --min-faults {c.min_faults} --rate {c.rate_per_s:g} "
            f"--min-jobs {c.min_jobs} --launcher {c.launcher}",
        ]
        return "\n".join(lines)


def _counts(found: Counter[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(found.items()))


def _make_token(engine: Engine) -> str:
    with engine.begin() as conn:
        team_store.ensure_team(conn, workload.TEAM, TeamQuota(gpu_quota=64, max_gpus_per_job=4), utcnow())
        return team_store.create_token(conn, workload.TEAM, team_store.Role.MEMBER, utcnow(), "fault suite")


def _open_jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(~jobs.c.state.in_(FINAL_JOB_STATES))).scalar_one())


def run_campaign(campaign: Campaign, work: Path, echo: Echo = print) -> Report:
    started = time.monotonic()
    run = work / f"seed-{campaign.seed}"
    run.mkdir(parents=True)
    os.chmod(run, 0o755)  # the postgres user's socket and the workers reach into it
    report = Report(campaign, run)
    echo(f"fault campaign seed {campaign.seed}: starting PostgreSQL, Redis and the control plane in {run}")
    workload.write_runtime_config(run)
    with contextlib.ExitStack() as undo:  # every part is stopped in reverse, however far it got
        target = _start(campaign, run, undo, echo)
        echo(f"  control plane up after {time.monotonic() - started:.0f}s")
        plans = workload.plan(
            campaign.seed,
            duration_s=campaign.fault_s,
            rate_per_s=campaign.rate_per_s,
            min_jobs=campaign.min_jobs,
            run=run,
            lease_s=campaign.lease_s,
            store=target.pods.store if target.pods else None,
        )
        stop = threading.Event()
        undo.callback(stop.set)
        began = time.monotonic()
        token = _make_token(target.engine)
        if target.pods is not None:  # the team exists: its namespace, as a cluster admin applies it
            target.pods.apply_namespaces(target.cluster.env)
        client = workload.Client(
            target.cluster.api_url,
            token,
            plans,
            give_up_at=began + campaign.fault_s + campaign.quiesce_s,
            stop=stop,
        )
        kinds = KUBERNETES_FAULTS if target.pods else FAULTS
        injector = Injector(
            target,
            campaign.seed,
            until=began + campaign.fault_s,
            echo=echo,
            kinds=kinds,
            at_least=campaign.min_faults,
            began=began,
        )
        undo.callback(lambda: (run / "faults.log").write_text("\n".join(injector.log) + "\n"))
        threads = [
            threading.Thread(target=client.run, args=(began,), name="workload", daemon=True),
            threading.Thread(target=injector.run, args=(stop,), name="faults", daemon=True),
        ]
        for thread in threads:
            thread.start()
        echo(f"  {len(plans)} jobs planned over {campaign.fault_s:g}s; faults strike until then")
        _supervise(target, report, echo, busy=lambda: any(t.is_alive() for t in threads))
        report.quiesced_s = _settle(target, report, client, campaign, echo)
        history = _history(target, client, campaign.lease_s, injector.stalls)
        report.violations = check(history)
        echo(f"  invariants checked after {time.monotonic() - started:.0f}s: stopping everything")
        report.rejected, report.injected = list(client.rejected), injector.injected
        report.jobs = Counter(job.state for job in history.jobs.values())
        report.attempts = Counter(attempt.state for attempt in history.attempts.values())
    report.wall_s = time.monotonic() - started
    return report


def _start(campaign: Campaign, run: Path, undo: contextlib.ExitStack, echo: Echo) -> Target:
    """The servers, their links, the disks, the journal and the control plane, each undone by `undo`."""
    postgres = Postgres().start()
    undo.callback(postgres.stop)
    (run / "redis").mkdir()
    redis_server = Redis(run / "redis").start()
    undo.callback(redis_server.stop)
    # Each component in a network namespace of its own, the links listening on the bridge, so one
    # component can be cut off from all the others (network.py); where none can be made, loopback.
    network = None
    if Network.possible():
        network = Network(COMPONENTS).create()
        undo.callback(network.remove)
    else:
        echo("  (no network namespaces: not root? no partition fault)")
    listen = network.gateway if network else "127.0.0.1"
    links = [
        FaultProxy("127.0.0.1", postgres.port, name="PostgreSQL link", listen=listen).start(),
        FaultProxy("127.0.0.1", redis_server.port, name="Redis link", listen=listen).start(),
    ]
    for link in links:
        undo.callback(link.stop)
    # The suite's own view of the store, straight to PostgreSQL; it pings before each use, since
    # the suite restarts the server under it.
    engine = create_engine(
        postgres.url().replace("postgresql://", "postgresql+psycopg://"), pool_pre_ping=True
    )
    undo.callback(engine.dispose)
    # The node's disk (the local launcher's attempt directories) and the checkpoint store, small
    # enough to fill at will.
    on_cluster = campaign.launcher == "kubernetes"
    disks = (
        [] if on_cluster else [SmallDisk(run / "home" / "attempts", 256), SmallDisk(run / "checkpoints", 256)]
    )
    for disk in disks:
        if disk.mount():
            undo.callback(disk.unmount, keep=run / "kept" / disk.path.name)
        else:
            echo(f"  (no tmpfs could be mounted at {disk.path}: not root? no full-disk fault there)")
    journal = JournalCollector(run / "journal.sock", run / "journal.jsonl")
    undo.callback(journal.close)
    pods, api_port = None, free_port()
    if on_cluster:
        pods = Pods(run, listen, (network.address("api") if network else "127.0.0.1", api_port)).start()
        undo.callback(pods.stop)
        # The pods' workers run as the launcher's run_as_user: the journal and the runtime's work folders
        # (runtime_worker.py) are open to it.
        (run / "journal.sock").chmod(0o666)
        (run / "runtime").mkdir()
        (run / "runtime").chmod(0o1777)
    undo.callback(_kill_leftovers, run)
    undo.callback(thaw_all)  # before the kill: a frozen worker dies of nothing until thawed
    cluster = Cluster(
        run,
        database_url=postgres.url(links[0].port, host=listen),
        redis_url=f"redis://{listen}:{links[1].port}/0",
        api_port=api_port,
        lease_s=campaign.lease_s,
        network=network,
        launcher=pods.env() if pods else None,
    )
    migrate(engine)
    undo.callback(cluster.stop)
    cluster.start(engine)
    return Target(
        cluster, postgres, redis_server, links[0], links[1], engine, journal, run, STREAM, disks, pods=pods
    )


def _kill_leftovers(run: Path) -> None:
    for pids in labelled("FAULTS_RUN", run.name).values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _settle(
    target: Target, report: Report, client: workload.Client, campaign: Campaign, echo: Echo
) -> float | None:
    """Heal everything, then wait for quiescence: every job final and no worker left. A slow machine
    only makes it wait longer (up to `quiesce_s`); a control plane that stopped moving is given
    `stall_s`. Returns how long it took, or None if it never came."""
    for link in (target.postgres_link, target.redis_link):
        link.heal()
    if target.cluster.network is not None:
        target.cluster.network.heal_all()
    for name in target.cluster.components:
        target.cluster.skew(name, 0)
    healed = time.monotonic()
    echo("  faults stopped, everything healed: waiting for every job to end")
    client.wait()
    progress, moved = None, time.monotonic()

    def waiting() -> bool:
        nonlocal progress, moved
        now = (_open_jobs(target.engine), len(target.journal.records))
        if now != progress:
            progress, moved = now, time.monotonic()
        quiet = now[0] == 0 and not labelled("FAULTS_RUN", target.run.name)
        return not quiet and time.monotonic() < min(healed + campaign.quiesce_s, moved + campaign.stall_s)

    _supervise(target, report, echo, busy=waiting)
    quiet = _open_jobs(target.engine) == 0 and not labelled("FAULTS_RUN", target.run.name)
    return time.monotonic() - healed if quiet else None


def _history(
    target: Target, client: workload.Client, lease_s: float, stalls: list[tuple[float, float]]
) -> History:
    job_rows, attempt_rows, events = read_store(target.engine)
    leftovers = labelled("FAULTS_RUN", target.run.name)
    (target.run / "history.json").write_text(
        json.dumps(
            {"jobs": job_rows, "attempts": attempt_rows, "events": events},
            default=lambda o: asdict(o) if is_dataclass(o) else str(o),
            indent=1,
        )
    )
    return History(
        jobs=job_rows,
        attempts=attempt_rows,
        events=events,
        journal=list(target.journal.records),
        # how the workers ended: their shims' files, or their pods' containers as the kubelet reported
        exits=target.pods.exits if target.pods else read_exits(target.cluster.home / "attempts"),
        ended=target.pods.ended if target.pods else read_exit_times(target.cluster.home / "attempts"),
        verdicts=target.pods.ended if target.pods else read_verdict_times(target.cluster.home / "attempts"),
        submissions=list(client.submissions.values()),
        cancels=list(client.cancels),
        kills=dict(target.kills),
        disruptions=dict(target.disruptions),
        unheard={attempt: list(spans) for attempt, spans in target.unheard.items()},
        leftovers=leftovers,
        stuck={attempt: describe(pids) for attempt, pids in leftovers.items()},
        lease_s=lease_s,
        stalls=list(stalls),
    )


def _supervise(target: Target, report: Report, echo: Echo, *, busy: Callable[[], bool]) -> None:
    """While `busy()`: restart what the faults killed, as an orchestrator would; progress every 10 s."""
    next_progress = time.monotonic() + 10
    while busy():
        report.restarts.update(target.cluster.supervise())
        if time.monotonic() >= next_progress:
            next_progress += 10
            with contextlib.suppress(Exception):  # the database may be away just now
                echo(f"  ... {_open_jobs(target.engine)} jobs not final")
        time.sleep(0.5)
