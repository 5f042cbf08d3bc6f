"""The faults a campaign injects, one small function each, and the seeded schedule that runs them.

A fault acts at once (a SIGKILL, a restart, a FLUSHALL, copies on the bus) or for a while (a slow,
black-holed or cut link; a component partitioned from the others; a skewed clock; a full disk),
healing itself before it returns. Each returns
what it did, or None when it found nothing to act on (no attempt running, say). Faults run one after
another; the moments, kinds, durations and choices all come from the seed, so a failing seed replays
the same schedule (the processes' own interleaving is the machine's).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from gpuyard.store.tables import attempts
from sqlalchemy import Engine, select

from .backends import Postgres, Redis, SmallDisk
from .cluster import Cluster, labelled
from .history import JournalCollector
from .pausing import Frozen, stopped
from .proxy import FaultProxy

if TYPE_CHECKING:
    from .kubernetes import Pods

SLOW_FSYNC = "slow-fsync"  # the file in the run directory that slows workers' fsyncs (worker.py's name)
SKEW_LIMIT_S = 20.0  # the largest skew of one component's clock (docs/faults.md, "Clocks")


@dataclass
class Target:
    """Everything a fault may act on."""

    cluster: Cluster
    postgres: Postgres
    redis: Redis
    postgres_link: FaultProxy
    redis_link: FaultProxy
    engine: Engine  # direct to PostgreSQL, not through the link: the suite's own view
    journal: JournalCollector
    run: Path
    stream: str
    disks: list[SmallDisk] = field(default_factory=list)
    kills: dict[str, float] = field(default_factory=dict)  # attempt -> when the suite killed its workers
    pods: Pods | None = None  # the emulated cluster, where the Kubernetes launcher runs the workers
    disruptions: dict[str, float] = field(default_factory=dict)  # attempt -> when its pod was taken away
    # attempt -> (from, to) when its pod's node reported nothing (partitioned, NotReady, cut off)
    unheard: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


Fault = Callable[[Target, random.Random], str | None]


def running_attempts(target: Target) -> list[str]:
    with target.engine.connect() as conn:
        return sorted(conn.execute(select(attempts.c.id).where(attempts.c.state == "RUNNING")).scalars())


def _worker_groups(target: Target, attempt_id: str) -> list[int]:
    """The process groups of an attempt's workers (each shim leads one; on the cluster, each pod's
    container)."""
    if target.pods is not None:
        groups = set()
        for pid in labelled("FAULTS_RUN", target.run.name).get(attempt_id, []):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        return sorted(groups)
    try:
        listing = json.loads((target.cluster.home / "attempts" / attempt_id / "workers.json").read_text())
    except (OSError, ValueError):
        return []
    return [int(pid) for pid in listing["pids"]]


def _kill_attempt(target: Target, attempt_id: str) -> bool:
    """SIGKILL every process of the attempt's workers, shims included: the node lost them."""
    groups = _worker_groups(target, attempt_id)
    target.kills.setdefault(attempt_id, time.monotonic())
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    return bool(groups)


# -- processes -------------------------------------------------------------------------------------


def kill_api_worker(target: Target, rng: random.Random) -> str | None:
    workers = target.cluster.api_workers()
    if not workers:
        return None
    pid = rng.choice(sorted(workers))
    os.kill(pid, signal.SIGKILL)
    return f"API worker {pid}"


def kill_relay(target: Target, rng: random.Random) -> str | None:
    pid = target.cluster.kill("relay")
    return None if pid is None else f"relay {pid}"


def kill_leader(target: Target, rng: random.Random) -> str | None:
    leader = target.cluster.leader(target.engine)
    if leader is None:
        return None
    return f"{leader} (leading) {target.cluster.kill(leader)}"


def kill_worker(target: Target, rng: random.Random) -> str | None:
    running = running_attempts(target)
    if not running:
        return None
    attempt_id = rng.choice(running)
    return f"workers of {attempt_id}" if _kill_attempt(target, attempt_id) else None


def kill_mid_checkpoint(target: Target, rng: random.Random) -> str | None:
    """Hold a running attempt's next save half-written (tests/faults/worker.py), then SIGKILL it. Up
    to three running attempts are tried in turn: one may save nothing meanwhile (it ends, or it is a
    plain command that never checkpoints)."""
    running = running_attempts(target)
    for attempt_id in rng.sample(running, min(3, len(running))):
        if (done := _kill_half_written(target, attempt_id)) is not None:
            return done
    return None


def _kill_half_written(target: Target, attempt_id: str) -> str | None:
    hold = target.run / "hold" / attempt_id
    hold.parent.mkdir(exist_ok=True)
    hold.touch()
    try:
        half = target.journal.wait_for(lambda r: r.attempt == attempt_id and r.e == "half_written", 6.0)
        if half is None:
            return None  # it saved nothing meanwhile (it ended, or it does not checkpoint)
        _kill_attempt(target, attempt_id)
        return f"workers of {attempt_id} half way through writing step {half.data['step']}"
    finally:
        hold.unlink(missing_ok=True)


def full_disk(target: Target, rng: random.Random) -> str | None:
    """The node's disk (the launcher's attempt directories: exit files, logs) or the checkpoint store
    is full for a while: every write there fails with ENOSPC."""
    disks = [disk for disk in target.disks if disk.mounted]
    if not disks:
        return None
    disk = rng.choice(disks)
    duration = rng.uniform(2.0, 6.0)
    disk.fill()
    try:
        time.sleep(duration)
    finally:
        disk.free()
    return f"{disk.path.name} disk full for {duration:.1f}s"


# -- pauses: the process is there, holds what it held, and does nothing ----------------------------


def _pause_for(target: Target, rng: random.Random, lease: float) -> float:
    """Past `lease` (the leader's, or an attempt's), by up to half of it again."""
    return rng.uniform(1.05, 1.5) * lease


def _pause(pid: int, seconds: float) -> None:
    with stopped(pid):
        time.sleep(seconds)


def pause_leader(target: Target, rng: random.Random) -> str | None:
    """SIGSTOP the leading scheduler past its leader lease (half the lease): a standby takes the lead
    while the paused one still believes it leads, and goes on from where it stopped when continued."""
    leader = target.cluster.leader(target.engine)
    pid = target.cluster.components[leader].pid if leader else None
    if pid is None:
        return None
    seconds = _pause_for(target, rng, target.cluster.lease_s / 2)
    _pause(pid, seconds)
    return f"{leader} (leading) {pid} stopped for {seconds:.1f}s"


def pause_relay(target: Target, rng: random.Random) -> str | None:
    pid = target.cluster.components["relay"].pid
    if pid is None:
        return None
    seconds = _pause_for(target, rng, target.cluster.lease_s)
    _pause(pid, seconds)
    return f"relay {pid} stopped for {seconds:.1f}s"


def pause_api_worker(target: Target, rng: random.Random) -> str | None:
    """One API worker stopped with requests in hand (heartbeats, submits): its clients time out."""
    workers = target.cluster.api_workers()
    if not workers:
        return None
    pid = rng.choice(sorted(workers))
    seconds = _pause_for(target, rng, target.cluster.lease_s)
    _pause(pid, seconds)
    return f"API worker {pid} stopped for {seconds:.1f}s"


def pause_worker(target: Target, rng: random.Random) -> str | None:
    """Freeze a running attempt's whole tree (shims and workers) past its lease: no heartbeat, no step,
    while its processes still exist."""
    running = running_attempts(target)
    if not running:
        return None
    attempt_id = rng.choice(running)
    groups = _worker_groups(target, attempt_id)
    if not groups:
        return None
    seconds = _pause_for(target, rng, target.cluster.lease_s)
    with Frozen(groups) as frozen:
        if not frozen.pids:
            return None
        time.sleep(seconds)
    return f"workers of {attempt_id} ({len(frozen.pids)} processes) frozen for {seconds:.1f}s ({frozen.how})"


def slow_fsync(target: Target, rng: random.Random) -> str:
    """The checkpoint disk is slow for a while: every fsync of a save waits (worker.py, runtime_worker.py),
    so saves outlast heartbeats, leases and the grace period of a preemption."""
    delay, seconds = rng.uniform(0.3, 2.5), rng.uniform(4, 12)
    flag = target.run / SLOW_FSYNC
    flag.write_text(f"{delay:.3f}")
    try:
        time.sleep(seconds)
    finally:
        flag.unlink(missing_ok=True)
    return f"every checkpoint fsync {delay * 1000:.0f} ms slower for {seconds:.1f}s"


# -- servers ---------------------------------------------------------------------------------------


def restart_postgres(target: Target, rng: random.Random) -> str | None:
    crash = rng.random() < 0.5
    target.postgres.restart(crash=crash)
    return "PostgreSQL " + ("crashed and restarted" if crash else "restarted")


def restart_redis(target: Target, rng: random.Random) -> str | None:
    target.redis.restart()
    return "Redis restarted (empty)"


def flush_redis(target: Target, rng: random.Random) -> str | None:
    target.redis.flushall()
    return "Redis FLUSHALL"


def duplicate_bus_messages(target: Target, rng: random.Random) -> str | None:
    """Publish copies of recent messages again, shuffled: duplicated and reordered deliveries."""
    client = redis.Redis(port=target.redis.port, decode_responses=True, socket_timeout=5)
    try:
        recent = client.xrevrange(target.stream, count=50)
        if not recent:
            return None
        copies = [fields for _, fields in rng.sample(recent, min(len(recent), rng.randint(5, 30)))]
        copies = copies * rng.randint(1, 3)
        rng.shuffle(copies)
        for fields in copies:
            client.xadd(target.stream, fields)  # type: ignore[arg-type]
    finally:
        client.close()
    return f"{len(copies)} copies of bus messages, reordered"


def degrade(link: Callable[[Target], FaultProxy], mode: str, seconds: tuple[float, float]) -> Fault:
    """The fault that sets one of the target's links to `mode` for a while (`seconds`: the shortest and
    the longest), then heals it."""

    def fault(target: Target, rng: random.Random) -> str:
        proxy = link(target)
        duration = rng.uniform(*seconds)
        delay = rng.uniform(0.05, 0.4) if mode == "delay" else 0.0
        proxy.set(mode, delay_s=delay)  # type: ignore[arg-type]
        time.sleep(duration)
        proxy.heal()
        return f"{proxy.name}: {mode}{f' {delay * 1000:.0f} ms' if delay else ''} for {duration:.1f}s"

    return fault


def _postgres(target: Target) -> FaultProxy:
    return target.postgres_link


def _redis(target: Target) -> FaultProxy:
    return target.redis_link


def partition(target: Target, rng: random.Random) -> str | None:
    """Cut one component (and the workers it started) off from every other and from PostgreSQL and
    Redis, past an attempt's lease, then restore its link. Cut off, the leader loses its lead to the
    standby while it still believes it leads, and its workers lose their heartbeats while they go on
    running and writing checkpoints; the API answers nobody; the relay publishes nothing."""
    network = target.cluster.network
    if network is None:
        return None
    leader = target.cluster.leader(target.engine)
    name = rng.choice(sorted(target.cluster.components))
    seconds = _pause_for(target, rng, target.cluster.lease_s)
    network.cut(name)
    try:
        time.sleep(seconds)
    finally:
        network.heal(name)
    return f"{name}{' (leading)' if name == leader else ''} cut off for {seconds:.1f}s"


def skew_clock(target: Target, rng: random.Random) -> str:
    name = rng.choice(sorted(target.cluster.components))
    offset = rng.choice([-1, 1]) * rng.uniform(5, SKEW_LIMIT_S)
    duration = rng.uniform(5, 15)
    target.cluster.skew(name, offset)
    time.sleep(duration)
    target.cluster.skew(name, 0)
    return f"{name}'s clock {offset:+.0f}s for {duration:.1f}s"


FAULTS: dict[str, Fault] = {
    "kill-api-worker": kill_api_worker,
    "kill-relay": kill_relay,
    "kill-leader": kill_leader,
    "kill-worker": kill_worker,
    "kill-mid-checkpoint": kill_mid_checkpoint,
    "full-disk": full_disk,
    "restart-postgres": restart_postgres,
    "restart-redis": restart_redis,
    "flush-redis": flush_redis,
    "duplicate-bus-messages": duplicate_bus_messages,
    "delay-postgres": degrade(_postgres, "delay", (3, 8)),
    "blackhole-postgres": degrade(_postgres, "blackhole", (2, 18)),
    "cut-postgres": degrade(_postgres, "cut", (1, 6)),
    "delay-redis": degrade(_redis, "delay", (3, 8)),
    "blackhole-redis": degrade(_redis, "blackhole", (2, 12)),
    "cut-redis": degrade(_redis, "cut", (1, 6)),
    "skew-clock": skew_clock,
    "pause-leader": pause_leader,
    "pause-relay": pause_relay,
    "pause-api-worker": pause_api_worker,
    "pause-worker": pause_worker,
    "slow-fsync": slow_fsync,
    "partition": partition,
}


# Faults that can keep the platform from noticing an attempt's end while they last: its leader gone,
# paused or cut off (a standby takes the lead after the leader lease), its database unreachable.
STALLS_THE_CONTROL_PLANE = frozenset(
    {
        "kill-leader",
        "pause-leader",
        "partition",
        "restart-postgres",
        "delay-postgres",
        "blackhole-postgres",
        "cut-postgres",
    }
)


class Injector:
    """Runs faults at random moments until `until` (monotonic), and past it (by at most as long again,
    while the jobs that arrived still run) until it injected `at_least`; counts what it injected. On
    a loaded machine most kinds may find nothing to act on in a short window (no pod running yet).

    Kinds are dealt from a seeded deck of every kind, shuffled again when it runs out: a campaign
    strikes with every kind before it repeats one, so a long run covers each kind about as often as
    the next. A kind that found nothing to act on (no attempt running) goes under the deck."""

    def __init__(
        self,
        target: Target,
        seed: int,
        *,
        until: float,
        echo: Callable[[str], None],
        gap_s: tuple[float, float] = (1.0, 4.0),
        kinds: Mapping[str, Fault] = FAULTS,
        at_least: int = 0,
        began: float | None = None,
    ):
        """`began`: when the window opened (monotonic; default now): the window past `until` is as long."""
        self.target, self.until, self.echo, self.gap_s, self.kinds = target, until, echo, gap_s, kinds
        self.at_least = at_least
        self.last_chance = until + (until - (time.monotonic() if began is None else began))
        self.rng = random.Random(f"faults-{seed}")
        self.injected: Counter[str] = Counter()
        self.log: list[str] = []
        self.stalls: list[tuple[float, float]] = []  # monotonic windows of STALLS_THE_CONTROL_PLANE

    def run(self, stop: threading.Event) -> None:
        deck: list[str] = []
        while not stop.wait(self.rng.uniform(*self.gap_s)) and self._striking(time.monotonic()):
            if not deck:
                deck = sorted(self.kinds)
                self.rng.shuffle(deck)
            kind = deck.pop()
            started = time.monotonic()
            try:
                done = self.kinds[kind](self.target, self.rng)
            except Exception as error:  # a fault that could not be injected is reported, not fatal
                done = f"could not inject: {error!r}"
            else:
                if done is None:
                    deck.insert(0, kind)
                    continue
                self.injected[kind] += 1
                if kind in STALLS_THE_CONTROL_PLANE:
                    self.stalls.append((started, time.monotonic()))
            line = f"{started:10.1f} {kind}: {done}"  # the monotonic clock, as the journal and the logs
            self.log.append(line)
            self.echo(f"  {line}")

    def _striking(self, now: float) -> bool:
        """Within the window, or past it while short of `at_least` and within as long again."""
        if now < self.until:
            return True
        return sum(self.injected.values()) < self.at_least and now < self.last_chance
