"""The event-driven trace simulator: a virtual cluster driven by THE scheduling cycle.

A virtual clock jumps from event to event (arrivals, completions, the end of a preemption's checkpoint,
node interruptions and recoveries). After each batch of events at the same instant, the simulator
builds a snapshot (PendingJob, RunningAttempt, ClusterState) of its virtual cluster, calls
`gpuyard.scheduler.cycle.run_cycle` with the chosen policy, and applies the decisions: placements
become attempts holding GPUs, evictions become checkpoint-then-requeue. No policy code lives here and
no policy sees a job's duration; only the simulator knows when an attempt will finish.

The attempt model: a resumed attempt first restores its checkpoint (restore time, GPUs held, no
progress), then computes, pausing every checkpoint interval to write a checkpoint (checkpoint cost).
A preemption asks for one more checkpoint and releases the GPUs once it is written, so nothing is lost;
a node interruption kills every attempt on the node at once, which loses the progress made since its
last complete checkpoint, and the node comes back after `node_down_s`.

With a site model (`SimConfig.sites`, sim/sites.py) each job has a home site, where its data lies;
an attempt first copies to its site what it lacks there (its checkpoint, its data: the cycle's own
`PendingJob.needs`) over the WAN, GPUs held, each direction's link shared equally by the copies
under way; and site events take part of a site down for a while, its attempts lost as at an
interruption.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.placement import Placement
from gpuyard.domain.sites import Held, copy_source, egress_usd, staged_bytes
from gpuyard.domain.states import AttemptState
from gpuyard.scheduler.cycle import run_cycle
from gpuyard.scheduler.policy import Policy
from gpuyard.scheduler.sites import pays_after_s
from gpuyard.scheduler.snapshot import LAS_THRESHOLDS, ClusterState, FleetIndex, PendingJob, RunningAttempt
from gpuyard.scheduler.starvation import Standing, StarvationGuard
from gpuyard.sim.sites import SiteModel
from gpuyard.sim.trace import TraceJob

# Event kinds, in the order they are handled at one instant: capacity comes back before it is taken.
# _DEMOTE only asks for a cycle: a running attempt reaches a 2D-LAS threshold (`SimConfig.las_wakes`);
# so does _MOVE_PAYS: a queued job's move to another site starts to pay (`sim/sites.py`). _COPIED: a
# checkpoint copy between sites has sent its bytes, and the link's other copies speed up.
_FINISH, _COPIED, _STOPPED, _NODE_UP, _SITE_UP, _INTERRUPT, _SITE_DOWN, _ARRIVAL, _DEMOTE, _MOVE_PAYS = range(
    10
)


class SimulationError(RuntimeError):
    """An invariant of the virtual cluster broke: a GPU leased twice, a gang split across domains."""


@dataclass(frozen=True)
class SimConfig:
    checkpoint_cost_s: float = 30.0
    restore_s: float = 60.0
    # "auto": Young/Daly sqrt(2 x cost x MTBI) on placements with interruptible nodes and
    # `fixed_interval_s` elsewhere; a number: that interval everywhere.
    checkpoint_interval: str | float = "auto"
    fixed_interval_s: float = 3600.0
    preemptible_mtbi_s: float | None = 24 * 3600.0  # spot pool; None: never interrupted
    on_demand_mtbi_s: float | None = None  # on-demand pool; None: never interrupted
    node_down_s: float = 600.0  # an interrupted node is replaced after this long
    seed: int = 0
    priority: int = 0  # every trace job's priority class (Philly has none)
    interruptions: tuple[tuple[float, str], ...] = ()  # extra (seconds after start, node), for tests
    # Events within this many seconds of the first one are applied together before ONE cycle (the
    # service runs a pass every second); 0: a cycle after every distinct instant. Strict FIFO is
    # chaotic under such shifts (its dev-week avg JCT moves from 14.6 h to 22.8 h at 1 s), so the
    # benchmark keeps 0.
    cycle_period_s: float = 0.0
    # Run a cycle when a running attempt reaches a 2D-LAS threshold (Tiresias' queue jump events), not
    # only at the next arrival or completion: the public simulator's timing (sim/reference.py).
    las_wakes: bool = False
    # Sites (sim/sites.py): the WAN, each team's home site, checkpoint sizes, site events. None: the
    # fleet's sites are not modelled (no home, no copies charged).
    sites: SiteModel | None = None


@dataclass
class _Job:
    trace: TraceJob
    nodes: int
    gpus: int  # GPUs leased per attempt (the trace's count, rounded up to whole slices per node)
    submitted_s: float
    work_s: float
    saved_s: float = 0.0  # durable progress: the newest complete checkpoint
    attained_gpu_s: float = 0.0  # GPU-seconds leased so far (2D-LAS attained service)
    first_start_s: float | None = None
    finished_s: float | None = None
    pending_since_s: float = 0.0
    pending_s: float = 0.0
    attempts: int = 0
    home: str | None = None  # its team's site (with a site model)
    checkpoint_site: str | None = None  # where its newest checkpoint lies (when saved_s > 0)


@dataclass
class _Attempt:
    id: str
    job: _Job
    placement: Placement
    borrowed: bool
    price_per_hour: float  # sum over its GPUs
    start_s: float
    restore_s: float
    interval_s: float  # 0: every instant is saved (free checkpoints); inf: never checkpoints
    checkpoint_s: float
    base_saved_s: float  # job's durable progress when the attempt started
    finish_s: float
    stop_s: float | None = None  # when it was asked to checkpoint and stop
    ended: bool = False
    started_at: datetime | None = None
    # Moved from another site: its copy (`_Copy`), whose end sets `restore_s` (the copy, then the
    # restore proper, `after_copy_s`) and `finish_s` (then `work_s`: work and checkpoint writes).
    copy: _Copy | None = None
    after_copy_s: float = 0.0
    work_s: float = 0.0

    def checkpoints_done(self, t: float) -> float:
        """How many periodic checkpoints are complete at t (t itself when every instant is saved)."""
        if self.interval_s == 0:
            return t
        e = t - self.start_s - self.restore_s
        if e <= 0 or math.isinf(self.interval_s):
            return 0
        most = max(math.ceil((self.job.work_s - self.base_saved_s) / self.interval_s) - 1, 0)
        return min(int(e // (self.interval_s + self.checkpoint_s)), most)

    @property
    def resumed(self) -> bool:
        return self.base_saved_s > 0

    def _phase(self, t: float) -> tuple[float, float]:
        """(progress made by this attempt, progress of it saved in a complete checkpoint) at time t."""
        remaining = self.job.work_s - self.base_saved_s
        e = t - self.start_s - self.restore_s
        if e <= 0:
            return 0.0, 0.0
        if self.interval_s == 0:
            done = min(e, remaining)
            return done, done
        if math.isinf(self.interval_s):
            return min(e, remaining), 0.0
        period = self.interval_s + self.checkpoint_s
        k = int(e // period)
        most = max(math.ceil(remaining / self.interval_s) - 1, 0)  # checkpoints taken while work remains
        k = min(k, most)
        done = min(k * self.interval_s + min(e - k * period, self.interval_s), remaining)
        return done, k * self.interval_s

    def progress(self, t: float) -> float:
        return self._phase(t)[0]

    def durable(self, t: float) -> float:
        return self._phase(t)[1]

    def last_checkpoint_s(self, t: float) -> float | None:
        saved = self.durable(t)
        if saved <= 0 or math.isinf(self.interval_s):
            return None if self.base_saved_s <= 0 else self.start_s
        if self.interval_s == 0:
            return t
        k = round(saved / self.interval_s)
        return self.start_s + self.restore_s + k * (self.interval_s + self.checkpoint_s)


@dataclass(eq=False)
class _Copy:
    """A checkpoint copy under way from one site to another: it shares the link of its direction
    equally with the other copies under way (`Simulator.links`)."""

    attempt: _Attempt
    link: tuple[str, str]  # (from site, to site)
    size: float  # bytes
    left: float  # bytes not sent as of `since`
    since: float
    started: float
    version: int = 0  # of its _COPIED event: an earlier one is stale
    sent: bool = False  # its bytes are all sent (its round trips may still run)


@dataclass
class Totals:
    """What only the simulator counts; the attempts' own figures come from `SimResult.attempts`."""

    leased_in_window_gpu_s: float = 0.0  # GPU-seconds leased between the first and the last submit
    preemptions: int = 0
    preemptions_by_rule: dict[str, int] = field(default_factory=dict)  # preemption.RULES names
    interruptions: int = 0
    attempts_killed: int = 0
    cycles: int = 0
    # Free GPUs that no queued job can use (fragments), integrated between the first and last submit.
    stranded_in_window_gpu_s: float = 0.0
    # Sites (SimConfig.sites): attempts started at another site than the job's own (where a start
    # copies least: `PendingJob.own_site`), those of them that copied a checkpoint, what all attempts
    # copied (checkpoints and staged data).
    moves: int = 0
    checkpoint_moves: int = 0
    bytes_moved: float = 0.0
    egress_usd: float = 0.0
    transfer_s: float = 0.0  # seconds of copies (GPUs held at the destination meanwhile)
    # (start, end) of each copy, cut short or landed: how many ran at once (sites.peak_overlap).
    copies: list[tuple[float, float]] = field(default_factory=list)
    site_events: int = 0


@dataclass
class JobResult:
    id: str
    team: str
    gpus: int
    duration_s: float
    submitted_s: float
    first_start_s: float
    finished_s: float
    pending_s: float
    attempts: int

    @property
    def jct_s(self) -> float:
        return self.finished_s - self.submitted_s

    @property
    def wait_s(self) -> float:
        return self.first_start_s - self.submitted_s


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One attempt as it ended, in the terms the platform records (sim/metrics.py reads it through the
    accounting, domain/accounting.py). Seconds are the virtual clock's, from `SimResult.start`."""

    job_id: str
    team: str
    outcome: AttemptState  # SUCCEEDED, PREEMPTED (stopped after its checkpoint) or LOST (interrupted)
    gpus: int  # leased
    busy_gpus: float  # the trace's GPUs x the share of each it uses: what its steps keep busy
    start_s: float  # placed: the GPUs are leased and its workers run at once
    end_s: float
    restore_s: float  # restoring the checkpoint it resumed from
    stall_s: float  # writing checkpoints, periodic and the stop's
    lost_s: float  # progress made after its newest complete checkpoint, at an interruption
    resumed: bool  # it had a checkpoint to resume from
    made_step: bool  # it made progress past its restore
    price_per_hour: float  # of all its GPUs


@dataclass
class SimResult:
    policy: str
    jobs: list[JobResult]
    attempts: list[AttemptResult]
    rejected: list[tuple[str, str]]  # (job id, why it can never run on this fleet)
    totals: Totals
    capacity_gpus: int
    start: datetime
    end_s: float  # last completion, seconds after `start`
    last_submit_s: float
    stranded: list[tuple[float, int]]  # (seconds after `start`, stranded GPUs from then on), at each change


@dataclass(frozen=True)
class LeaseRecord:
    """What observers (the tests) see: every lease granted ("start") and given back ("end")."""

    at_s: float
    kind: str
    job_id: str
    attempt_id: str
    placement: Placement


Observer = Callable[[LeaseRecord], None]


@dataclass
class Simulator:
    fleet: Fleet
    quotas: dict[str, TeamQuota]
    policy: Policy
    config: SimConfig = field(default_factory=SimConfig)
    observer: Observer | None = None
    progress: Callable[[int], None] | None = None  # called with the number of jobs just finished

    def __post_init__(self) -> None:
        # What its cycles derive from the fleet alone, built once for the whole replay.
        self.index = FleetIndex(self.fleet)
        self.nodes: dict[str, Node] = self.index.nodes
        self.free: dict[str, set[int]] = {n.name: set(range(n.gpus)) for n in self.fleet.nodes}
        self.down: set[str] = set()  # interrupted or in a site event
        self.interrupted: set[str] = set()
        self.outage: Counter[str] = Counter()  # node -> site events holding it down
        self.links: dict[tuple[str, str], list[_Copy]] = {}  # (from, to) site -> copies sending bytes
        if self.config.sites is not None:
            self.config.sites.check(self.fleet)
        self.owner: dict[tuple[str, int], str] = {}  # (node, gpu) -> attempt id: the lease table
        self.pending: dict[str, _Job] = {}
        # What cycles see of the queue, kept as it changes: a backlog of thousands costs no rebuild.
        self.queue: dict[str, PendingJob] = {}
        self.queued_sizes: Counter[int] = Counter()  # GPUs asked -> pending jobs asking that many
        # (GPU models allowed, GPUs per node) -> pending jobs asking so: what a free GPU must offer
        self.queued_needs: Counter[tuple[tuple[str, ...], int]] = Counter()
        self.stranded: list[tuple[float, int]] = [(0.0, 0)]
        self.running: dict[str, _Attempt] = {}
        self.on_node: dict[str, set[str]] = {n.name: set() for n in self.fleet.nodes}
        self.usage: dict[str, int] = {}
        self.borrowed: dict[str, int] = {}
        self.events: list[tuple[float, int, int, object]] = []
        # When a queued job passes its starvation bound (starvation.StarvationGuard), a cycle must run then
        # even if nothing else happens: (instant, seq, job id, when it was queued).
        self.wakes: list[tuple[float, int, str, float]] = []
        self.seq = 0
        self.totals = Totals()
        self.done: list[JobResult] = []
        self.ended: list[AttemptResult] = []
        self.rng = {n.name: random.Random(f"{self.config.seed}:{n.name}") for n in self.fleet.nodes}
        self.max_per_node = max((n.gpus for n in self.fleet.nodes), default=0)
        self.domains = self.index.domains
        self.models = sorted({n.gpu_type for n in self.fleet.nodes})
        self.capacity = self.index.gpus
        self.preempting = self.policy.preempts
        # What cycles see of running attempts, rebuilt when it changes (see _next_change).
        self.snapshots: dict[str, RunningAttempt] = {}
        self.stale: list[tuple[float, int, _Attempt]] = []

    # -- events ---------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def _mtbi(self, node: Node) -> float | None:
        own = getattr(node, "mtbi_hours", None)  # a fleet file may set it per node
        if own:
            return 3600.0 * float(own)
        return self.config.preemptible_mtbi_s if node.preemptible else self.config.on_demand_mtbi_s

    def _schedule_interruption(self, node: Node, after_s: float) -> None:
        mtbi = self._mtbi(node)
        if mtbi:
            self._push(after_s + self.rng[node.name].expovariate(1.0 / mtbi), _INTERRUPT, node.name)

    # -- the run --------------------------------------------------------------------------------

    def shape(self, gpus: int) -> tuple[int, int]:
        """(nodes, GPUs leased) of a gang, by the policy's placement rule (`placements.PLACEMENTS`):
        gpuyard's rounds a gang up to even slices, YARN's leases exactly what was asked."""
        return self.policy.placement_rule.shape(gpus, self.max_per_node)

    def _feasible(self, nodes: int, per_node: int, gpu_types: tuple[str, ...]) -> bool:
        return any(
            sum(1 for n in members if n.gpus >= per_node and (not gpu_types or n.gpu_type in gpu_types))
            >= nodes
            for members in self.domains.values()
        )

    def run(self, trace: list[TraceJob]) -> SimResult:
        if not trace:
            raise ValueError("the trace has no job in the chosen window")
        start = min(j.submitted_at for j in trace)
        self.start = start
        self.last_submit_s = (max(j.submitted_at for j in trace) - start).total_seconds()
        rejected: list[tuple[str, str]] = []
        for tj in trace:
            nodes, leased = self.shape(tj.gpus)
            per_node = math.ceil(leased / nodes)
            if not self._feasible(nodes, per_node, tj.gpu_types):
                models = f" of {'|'.join(tj.gpu_types)}" if tj.gpu_types else ""
                rejected.append(
                    (tj.id, f"{nodes} node(s) x {per_node} GPUs{models} fit in no domain of the fleet")
                )
                continue
            job = _Job(tj, nodes, leased, (tj.submitted_at - start).total_seconds(), tj.duration_s)
            if self.config.sites is not None:
                job.home = self.config.sites.home_of(tj.team)
            self._push(job.submitted_s, _ARRIVAL, job)
        for event in self.config.sites.events if self.config.sites is not None else ():
            names = event.nodes(self.fleet)
            self._push(max(0.0, (event.start - start).total_seconds()), _SITE_DOWN, names)
            self._push(max(0.0, (event.end - start).total_seconds()), _SITE_UP, names)
        for node in self.fleet.nodes:
            self._schedule_interruption(node, 0.0)
        for at_s, name in self.config.interruptions:
            if name not in self.nodes:
                raise ValueError(f"interruption of unknown node {name!r}")
            self._push(at_s, _INTERRUPT, (name, "injected"))
        live = len(trace) - len(rejected)
        self.arrivals_left = live
        last_t, same_instant = -1.0, 0
        while (self.events or self._next_wake() < math.inf) and (len(self.done) < live):
            wake = self._next_wake()
            if not self.events or wake < self.events[0][0]:
                t = wake  # a queued job passes its starvation bound: only a cycle happens
                self._woken(t)
            else:
                t = self.events[0][0]
                until = t + max(self.config.cycle_period_s, 1e-9)
                while self.events and self.events[0][0] <= until:
                    at, kind, _, payload = heapq.heappop(self.events)
                    t = max(t, at)
                    self._handle(t, kind, payload)
            if not self.pending:
                self._record_stranded(t)
            else:
                same_instant = same_instant + 1 if t == last_t else 0
                last_t = t
                if same_instant > 10 * max(len(self.running), 100):
                    raise SimulationError(f"livelock at {t:.0f} s: cycles keep preempting and restarting")
                self._cycle(t)
                self._record_stranded(t)
                if not self.running and not self.down and not self.arrivals_left:
                    stuck = sorted(self.pending)[:5]
                    raise SimulationError(f"nothing runs and the cycle starts none of {stuck}: policy stuck")
        if len(self.done) < live:
            stuck = sorted(self.pending)[:5]
            raise SimulationError(f"{live - len(self.done)} job(s) never finished, e.g. {stuck}")
        end = max((j.finished_s for j in self.done), default=0.0)
        self._record_stranded(end)
        return SimResult(
            self.policy.name,
            self.done,
            self.ended,
            rejected,
            self.totals,
            self.capacity,
            start,
            end,
            self.last_submit_s,
            self.stranded,
        )

    def _handle(self, t: float, kind: int, payload: object) -> None:
        if kind == _ARRIVAL:
            assert isinstance(payload, _Job)
            self.arrivals_left -= 1
            self._enqueue(payload, t)
        elif kind == _FINISH:
            assert isinstance(payload, _Attempt)
            if not payload.ended and payload.finish_s <= t + 1e-9:
                self._finish(payload, t)
        elif kind == _COPIED:
            assert isinstance(payload, tuple)
            copy, version = payload
            self._copied(copy, version, t)
        elif kind == _STOPPED:
            assert isinstance(payload, _Attempt)
            if not payload.ended:
                self._stopped(payload, t)
        elif kind == _INTERRUPT:
            name, injected = payload if isinstance(payload, tuple) else (payload, None)
            assert isinstance(name, str)
            if name not in self.down:
                self._interrupt(name, t)
                self._push(t + self.config.node_down_s, _NODE_UP, (name, injected))
            elif injected is None and self.outage[name]:
                self._schedule_interruption(self.nodes[name], t)  # down for a site event: the next draw
        elif kind == _NODE_UP:
            assert isinstance(payload, tuple)
            name, injected = payload
            self.interrupted.discard(name)
            if not self.outage[name]:
                self.down.discard(name)
            if injected is None:
                self._schedule_interruption(self.nodes[name], t)
        elif kind == _SITE_DOWN:
            assert isinstance(payload, list)
            self.totals.site_events += 1
            for name in payload:
                self.outage[name] += 1
                if name not in self.down:
                    self.down.add(name)
                    self._lose_attempts_on(name, t)
        elif kind == _SITE_UP:
            assert isinstance(payload, list)
            for name in payload:
                self.outage[name] -= 1
                if not self.outage[name] and name not in self.interrupted:
                    self.down.discard(name)

    # -- fragmentation ----------------------------------------------------------------------------

    def stranded_gpus(self) -> int:
        """Free GPUs of nodes that are up where no queued job fits: fewer free than any queued job
        allowed on the node's GPU model asks per node. Idle GPUs with no queue are not stranded."""
        if not self.queued_needs:
            return 0
        need = {
            model: min(
                (per for (allowed, per) in self.queued_needs if not allowed or model in allowed),
                default=math.inf,
            )
            for model in self.models
        }
        return sum(
            len(gpus)
            for name, gpus in self.free.items()
            if gpus and len(gpus) < need[self.nodes[name].gpu_type] and name not in self.down
        )

    def _record_stranded(self, t: float) -> None:
        """A change of the stranded GPUs at `t`; the value before it is integrated over the window."""
        since, value = self.stranded[-1]
        now = self.stranded_gpus() if self.pending else 0
        if now != value:
            if value:
                window = max(0.0, min(t, self.last_submit_s) - since)
                self.totals.stranded_in_window_gpu_s += value * window
            self.stranded.append((t, now))

    # -- the scheduling cycle -------------------------------------------------------------------

    def _now(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t)

    def _share(self, team: str, without: int = 0) -> float:
        quota = self.quotas.get(team) or TeamQuota(gpu_quota=0)
        return (self.usage.get(team, 0) - without) / (max(quota.gpu_quota, 1) * quota.weight)

    def _demand(self, guard: StarvationGuard) -> float:
        """The fleet's demand as the guard reads it from a cycle's queue and snapshot."""
        queued = sum(gpus * n for gpus, n in self.queued_sizes.items())
        return guard.demand(queued, sum(self.usage.values()), self.capacity)

    def _wake_when_starving(self, job: _Job, t: float) -> None:
        """Queue a cycle for when the queued `job` passes its starvation bound, at today's share of
        its team (a cycle at that instant that finds it not starving yet, the share having grown,
        queues the next; a share that falls makes it starve sooner, seen at the next event)."""
        guard = self.policy.starvation
        if guard is not None:
            share = self._share(job.trace.team)
            demand = self._demand(guard)
            overdue = guard.overdue_s(
                Standing(job.submitted_s, job.gpus, job.attained_gpu_s, share, demand), t
            )
            if overdue <= 0:  # else it starves already: this cycle sees it
                self.seq += 1
                heapq.heappush(self.wakes, (t - overdue + 1e-6, self.seq, job.trace.id, job.pending_since_s))

    def _next_wake(self) -> float:
        """The next instant a job still queued (since the same time) passes its bound, or inf."""
        while self.wakes:
            at, _, job_id, since = self.wakes[0]
            job = self.pending.get(job_id)
            if job is not None and job.pending_since_s == since:
                return at
            heapq.heappop(self.wakes)
        return math.inf

    def _woken(self, t: float) -> None:
        _, _, job_id, _ = heapq.heappop(self.wakes)
        self._wake_when_starving(self.pending[job_id], t)  # the next wake, if it is not starving yet

    def _enqueue(self, job: _Job, t: float) -> None:
        job.pending_since_s = t
        checkpoint_bytes, data = self._held(job)
        self.pending[job.trace.id] = job
        self.queue[job.trace.id] = PendingJob(
            id=job.trace.id,
            team=job.trace.team,
            gpus=job.gpus,
            nodes=job.nodes,
            gpu_types=job.trace.gpu_types,
            priority=self.config.priority,
            preemptible=True,
            submitted_at=job.trace.submitted_at,
            checkpoint_site=job.checkpoint_site if job.saved_s > 0 else None,
            attained_gpu_s=job.attained_gpu_s,
            home_site=job.home,
            checkpoint_bytes=checkpoint_bytes,
            data=data,
            queued_at=self._now(t),
        )
        self.queued_sizes[job.gpus] += 1
        self.queued_needs[(job.trace.gpu_types, job.gpus // job.nodes)] += 1
        self._wake_when_starving(job, t)
        model = self.config.sites
        if model is not None and self.policy.site_rule.waits:
            for wait in pays_after_s(self.queue[job.trace.id], self.index.sites, model.wan):
                self._push(t + wait + 1e-6, _MOVE_PAYS, None)  # a cycle when a move starts to pay

    def _held(self, job: _Job) -> tuple[float, tuple[Held, ...]]:
        """With a site model, the sizes of what a start of the job needs at its site: its checkpoint
        (with saved progress), and its data (`SiteModel.staging_bytes`) at its home site. Without
        one, nothing."""
        model = self.config.sites
        if model is None:
            return 0.0, ()
        assert job.home is not None
        checkpoint = model.checkpoint_bytes(job.trace.gpus) if job.saved_s > 0 else 0.0
        return checkpoint, ((Held(model.staging_bytes, (job.home,)),) if model.staging_bytes else ())

    def _dequeue(self, job_id: str) -> _Job:
        job = self.pending.pop(job_id)
        del self.queue[job_id]
        self.queued_sizes[job.gpus] -= 1
        if not self.queued_sizes[job.gpus]:
            del self.queued_sizes[job.gpus]
        need = (job.trace.gpu_types, job.gpus // job.nodes)
        self.queued_needs[need] -= 1
        if not self.queued_needs[need]:
            del self.queued_needs[need]
        return job

    def _running_snapshot(self, attempt: _Attempt, t: float) -> RunningAttempt:
        ckpt = attempt.last_checkpoint_s(t)
        job = attempt.job
        if attempt.started_at is None:
            attempt.started_at = self._now(attempt.start_s)
        return RunningAttempt(
            attempt_id=attempt.id,
            job_id=job.trace.id,
            team=job.trace.team,
            priority=self.config.priority,
            preemptible=True,
            placement=attempt.placement,
            started_at=attempt.started_at,
            last_checkpoint_at=None if ckpt is None else self._now(ckpt),
            borrowed=attempt.borrowed,
            attained_gpu_s=job.attained_gpu_s + job.gpus * (t - attempt.start_s),
            stopping=attempt.stop_s is not None,
            submitted_at=job.trace.submitted_at,
        )

    def _next_change(self, attempt: _Attempt, t: float) -> float:
        """When the snapshot of `attempt` next changes what a cycle can read of it.

        That is its next complete checkpoint (what a preemption would lose), its next 2D-LAS queue,
        or (with a starvation guard) the instant the guard stops holding it;
        attained service in between is as of the last rebuild, as the cycle reads it only through
        those. Rebuilding every running snapshot at every cycle would dominate.
        """
        if attempt.interval_s == 0:
            return t + 1e-6  # every instant is saved: rebuilt at every cycle
        nxt = math.inf
        if not math.isinf(attempt.interval_s):
            k = attempt.checkpoints_done(t)
            most = max(math.ceil((attempt.job.work_s - attempt.base_saved_s) / attempt.interval_s) - 1, 0)
            if k < most:
                period = attempt.interval_s + attempt.checkpoint_s
                nxt = attempt.start_s + attempt.restore_s + (k + 1) * period
        job = attempt.job
        for threshold in LAS_THRESHOLDS:
            attained = job.attained_gpu_s + job.gpus * (t - attempt.start_s)
            if attained < threshold:
                nxt = min(nxt, attempt.start_s + (threshold - job.attained_gpu_s) / job.gpus)
                break
        guard = self.policy.starvation
        if guard is not None:
            share = self._share(job.trace.team, without=job.gpus)
            attained = job.attained_gpu_s + job.gpus * (t - attempt.start_s)
            held_s = guard.held_for_s(
                Standing(job.submitted_s, job.gpus, attained, share, self._demand(guard)), t
            )
            if held_s > 0:
                nxt = min(nxt, t + held_s)
        return max(nxt, t + 1e-6)

    def _refresh(self, attempt: _Attempt, t: float) -> None:
        self.snapshots[attempt.id] = self._running_snapshot(attempt, t)
        self.seq += 1
        heapq.heappush(self.stale, (self._next_change(attempt, t), self.seq, attempt))

    def _running_list(self, t: float) -> list[RunningAttempt]:
        while self.stale and self.stale[0][0] <= t + 1e-9:
            _, _, attempt = heapq.heappop(self.stale)
            if not attempt.ended:
                self._refresh(attempt, t)
        return list(self.snapshots.values())

    def _cycle(self, t: float) -> None:
        free_now = sum(len(g) for name, g in self.free.items() if name not in self.down)
        if not self.preempting and free_now < min(self.queued_sizes):
            return  # nothing can start and nothing may be preempted: the cycle would only wait
        state = ClusterState(
            index=self.index,
            free={name: (set() if name in self.down else set(g)) for name, g in self.free.items()},
            quotas=self.quotas,
            running=self._running_list(t) if self.preempting else [],
            usage=dict(self.usage),
            borrowed=dict(self.borrowed),
            wan=None if self.config.sites is None else self.config.sites.wan,
            copies={link: len(copies) for link, copies in self.links.items() if copies},
        )
        result = run_cycle(list(self.queue.values()), state, self._now(t), self.policy)
        self.totals.cycles += 1
        for eviction in result.evicted:
            attempt = self.running.get(eviction.attempt.attempt_id)
            if attempt is not None and attempt.stop_s is None:
                self._ask_to_stop(attempt, t)
                by_rule = self.totals.preemptions_by_rule
                by_rule[eviction.rule] = by_rule.get(eviction.rule, 0) + 1
        for placed in result.placed:
            self._start(self._dequeue(placed.job.id), placed.job, placed.placement, placed.borrowed, t)

    # -- attempts -------------------------------------------------------------------------------

    def _interval(self, placement: Placement) -> float:
        cost = self.config.checkpoint_cost_s
        if cost <= 0:
            return 0.0
        if self.config.checkpoint_interval != "auto":
            return float(self.config.checkpoint_interval)
        rate = sum(1.0 / m for name in placement.nodes if (m := self._mtbi(self.nodes[name])))
        if rate <= 0:
            return self.config.fixed_interval_s
        return math.sqrt(2.0 * cost * (1.0 / rate))  # Young/Daly, with the gang's combined MTBI

    def _start(self, job: _Job, queued: PendingJob, placement: Placement, borrowed: bool, t: float) -> None:
        if placement.gpus != job.gpus or len(placement.slices) != job.nodes:
            raise SimulationError(
                f"{job.trace.id} asked {job.nodes} x {job.gpus // job.nodes}, got {placement}"
            )
        keys = {self.nodes[s.node].domain_key for s in placement.slices}
        if len(keys) != 1 or keys != {(placement.site, placement.cluster, placement.domain)}:
            raise SimulationError(f"{job.trace.id}: gang split across domains {sorted(keys)}")
        job.attempts += 1
        attempt_id = f"{job.trace.id}-a{job.attempts}"
        price = 0.0
        for piece in placement.slices:
            if piece.node in self.down:
                raise SimulationError(f"{attempt_id} placed on {piece.node}, which is down")
            for gpu in piece.gpu_indices:
                if gpu not in self.free[piece.node] or (piece.node, gpu) in self.owner:
                    raise SimulationError(f"GPU {piece.node}:{gpu} leased twice ({attempt_id})")
                self.owner[(piece.node, gpu)] = attempt_id
            self.free[piece.node] -= set(piece.gpu_indices)
            self.on_node[piece.node].add(attempt_id)
            price += len(piece.gpu_indices) * self.nodes[piece.node].price_per_gpu_hour
        team = job.trace.team
        self.usage[team] = self.usage.get(team, 0) + job.gpus
        if borrowed:
            self.borrowed[team] = self.borrowed.get(team, 0) + job.gpus
        restore = self.config.restore_s if job.saved_s > 0 else 0.0
        size, source = self._copy(queued, placement)
        interval = self._interval(placement)
        remaining = job.work_s - job.saved_s
        checkpoints = (
            0 if interval == 0 or math.isinf(interval) else max(math.ceil(remaining / interval) - 1, 0)
        )
        cost = self.config.checkpoint_cost_s if interval else 0.0
        attempt = _Attempt(
            id=attempt_id,
            job=job,
            placement=placement,
            borrowed=borrowed,
            price_per_hour=price,
            start_s=t,
            restore_s=restore,
            interval_s=interval,
            checkpoint_s=cost,
            base_saved_s=job.saved_s,
            finish_s=t + restore + remaining + checkpoints * cost,
            after_copy_s=restore,
            work_s=remaining + checkpoints * cost,
        )
        if job.first_start_s is None:
            job.first_start_s = t
        job.pending_s += t - job.pending_since_s
        self.running[attempt_id] = attempt
        if source is not None:
            self._begin_copy(attempt, (source, placement.site), size, t)
        if self.preempting:
            self._refresh(attempt, t)
        self._push(attempt.finish_s, _FINISH, attempt)
        if self.config.las_wakes and self.preempting:
            for threshold in LAS_THRESHOLDS:
                if threshold > job.attained_gpu_s:
                    at = t + (threshold - job.attained_gpu_s) / job.gpus
                    if at < attempt.finish_s:
                        self._push(at, _DEMOTE, attempt)
        if self.observer is not None:
            self.observer(LeaseRecord(t, "start", job.trace.id, attempt_id, placement))

    def _copy(self, job: PendingJob, placement: Placement) -> tuple[float, str | None]:
        """What the attempt copies to its site first, as the cycle reckoned it (`domain.sites`): the
        bytes and the site they come from (None: nothing to copy). An attempt away from the job's own
        site counts as a move, and one that copies its checkpoint as a checkpoint move."""
        site = placement.site
        if self.config.sites is None:
            return 0.0, None
        if job.own_site is not None and site != job.own_site:
            self.totals.moves += 1
            if job.checkpoint_site not in (None, site) and job.checkpoint_bytes > 0:
                self.totals.checkpoint_moves += 1
        size = staged_bytes(site, job.needs)
        return (size, copy_source(site, job.needs)) if size > 0 else (0.0, None)

    # -- copies between sites: each direction's link shared equally by its copies ----------------

    def _begin_copy(self, attempt: _Attempt, link: tuple[str, str], size: float, t: float) -> None:
        """The attempt's GPUs are leased at the destination from `t`; it restores once the copy has
        sent its bytes (its share of the link, as the copies under way change) and made its round
        trips."""
        copy = _Copy(attempt, link, size, size, t, t)
        attempt.copy = copy
        copies = self.links.setdefault(link, [])
        self._settle(copies, t)
        copies.append(copy)
        self._reschedule(copies, t)

    def _settle(self, copies: list[_Copy], t: float) -> None:
        """Bring the bytes left of each copy on a link up to `t`, at the share each had."""
        if copies:
            assert self.config.sites is not None
            rate = self.config.sites.wan.bytes_per_s / len(copies)
            for copy in copies:
                copy.left = max(0.0, copy.left - rate * (t - copy.since))
                copy.since = t

    def _reschedule(self, copies: list[_Copy], t: float) -> None:
        """Each copy's end at the link's new share, and so its attempt's restore and finish."""
        if not copies:
            return
        assert self.config.sites is not None
        wan = self.config.sites.wan
        rate = wan.bytes_per_s / len(copies)
        for copy in copies:
            sent_at = t + copy.left / rate
            copy.version += 1
            self._push(sent_at, _COPIED, (copy, copy.version))
            self._copy_ends(copy, sent_at + wan.overhead_s, t)

    def _copy_ends(self, copy: _Copy, at: float, t: float) -> None:
        attempt = copy.attempt
        attempt.restore_s = at - attempt.start_s + attempt.after_copy_s
        attempt.finish_s = attempt.start_s + attempt.restore_s + attempt.work_s
        self._push(attempt.finish_s, _FINISH, attempt)  # an earlier one finds it changed: ignored
        if self.preempting:
            self._refresh(attempt, t)

    def _copied(self, copy: _Copy, version: int, t: float) -> None:
        """The copy has sent its bytes (unless the event is stale): the others share its part."""
        if version != copy.version or copy.sent or copy.attempt.ended:
            return
        copies = self.links[copy.link]
        self._settle(copies, t)
        copies.remove(copy)
        copy.sent = True
        self._count_copy(copy, copy.size, t)
        self._reschedule(copies, t)

    def _count_copy(self, copy: _Copy, sent: float, t: float) -> None:
        model = self.config.sites
        assert model is not None
        self.totals.bytes_moved += sent
        self.totals.egress_usd += egress_usd(sent, model.wan)
        end = t + (model.wan.overhead_s if copy.sent else 0.0)
        self.totals.transfer_s += end - copy.started
        self.totals.copies.append((copy.started, end))

    def _copy_cut(self, attempt: _Attempt, t: float) -> bool:
        """The attempt ends at `t`: its copy, if still sending, stops (what it sent is counted). True
        when its copy had landed (or there was none): the job's checkpoint is then at its site."""
        copy = attempt.copy
        if copy is None:
            return True
        if copy.sent:
            return t >= attempt.start_s + attempt.restore_s - attempt.after_copy_s
        copies = self.links[copy.link]
        self._settle(copies, t)
        copies.remove(copy)
        self._count_copy(copy, copy.size - copy.left, t)
        self._reschedule(copies, t)
        return False

    def _release(
        self, attempt: _Attempt, t: float, outcome: AttemptState, steps_s: float, lost_s: float
    ) -> None:
        """Give the attempt's GPUs back at `t` and record how it ended: `steps_s` of progress made, of
        which `lost_s` not saved; the rest of its time went to its restore and checkpoint writes."""
        attempt.ended = True
        del self.running[attempt.id]
        self.snapshots.pop(attempt.id, None)
        if self.observer is not None:
            self.observer(LeaseRecord(t, "end", attempt.job.trace.id, attempt.id, attempt.placement))
        for piece in attempt.placement.slices:
            for gpu in piece.gpu_indices:
                if self.owner.pop((piece.node, gpu), None) != attempt.id:
                    raise SimulationError(f"GPU {piece.node}:{gpu} was not leased by {attempt.id}")
            self.free[piece.node] |= set(piece.gpu_indices)
            self.on_node[piece.node].discard(attempt.id)
        job = attempt.job
        gpus = attempt.placement.gpus
        held = t - attempt.start_s
        if self._copy_cut(attempt, t):  # a copy cut short leaves the checkpoint where it was
            job.checkpoint_site = attempt.placement.site
        self.usage[job.trace.team] -= gpus
        if attempt.borrowed:
            self.borrowed[job.trace.team] -= gpus
        job.attained_gpu_s += gpus * held
        self.totals.leased_in_window_gpu_s += gpus * max(0.0, min(t, self.last_submit_s) - attempt.start_s)
        restore = min(attempt.restore_s, held)
        self.ended.append(
            AttemptResult(
                job_id=job.trace.id,
                team=job.trace.team,
                outcome=outcome,
                gpus=gpus,
                busy_gpus=job.trace.gpus * job.trace.gpu_share,
                start_s=attempt.start_s,
                end_s=t,
                restore_s=restore,
                stall_s=max(0.0, held - restore - steps_s),
                lost_s=lost_s,
                resumed=attempt.resumed,
                made_step=steps_s > 0,
                price_per_hour=attempt.price_per_hour,
            )
        )

    def _finish(self, attempt: _Attempt, t: float) -> None:
        job = attempt.job
        self._release(attempt, t, AttemptState.SUCCEEDED, job.work_s - attempt.base_saved_s, 0.0)
        job.saved_s = job.work_s
        job.finished_s = t
        assert job.first_start_s is not None
        self.done.append(
            JobResult(
                id=job.trace.id,
                team=job.trace.team,
                gpus=job.trace.gpus,
                duration_s=job.work_s,
                submitted_s=job.submitted_s,
                first_start_s=job.first_start_s,
                finished_s=t,
                pending_s=job.pending_s,
                attempts=job.attempts,
            )
        )
        if self.progress is not None:
            self.progress(1)

    def _ask_to_stop(self, attempt: _Attempt, t: float) -> None:
        """Preemption: write one more checkpoint (if there is unsaved progress), then release."""
        attempt.stop_s = t
        self.totals.preemptions += 1
        if self.preempting:
            self._refresh(attempt, t)
        unsaved = attempt.progress(t) > attempt.durable(t) + 1e-9
        done_at = t + (self.config.checkpoint_cost_s if unsaved else 0.0)
        if attempt.finish_s <= done_at:
            return  # it finishes before its checkpoint would: let it
        self._push(done_at, _STOPPED, attempt)

    def _stopped(self, attempt: _Attempt, t: float) -> None:
        assert attempt.stop_s is not None
        job = attempt.job
        made = attempt.progress(attempt.stop_s)
        job.saved_s = attempt.base_saved_s + made
        self._release(attempt, t, AttemptState.PREEMPTED, made, 0.0)
        self._enqueue(job, t)

    def _interrupt(self, name: str, t: float) -> None:
        self.totals.interruptions += 1
        self.interrupted.add(name)
        self.down.add(name)
        self._lose_attempts_on(name, t)

    def _lose_attempts_on(self, name: str, t: float) -> None:
        """The node is lost: every attempt on it ends LOST, keeping its newest complete checkpoint."""
        for attempt_id in sorted(self.on_node[name]):
            attempt = self.running[attempt_id]
            job = attempt.job
            # An attempt writing its stop checkpoint made no progress since the notice, and that
            # checkpoint dies with the node.
            at = t if attempt.stop_s is None else min(t, attempt.stop_s)
            made = attempt.progress(at)
            job.saved_s = attempt.base_saved_s + attempt.durable(at)
            self.totals.attempts_killed += 1
            self._release(attempt, t, AttemptState.LOST, made, made - attempt.durable(at))
            self._enqueue(job, t)
