"""What one scheduling cycle sees: pending work, running attempts, free GPUs, team quotas.

Plain values, no I/O: the service builds a snapshot from the store, the simulator from its
virtual cluster, and both hand it to the same cycle.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node, holds_host_resources
from gpuyard.domain.placement import Placement
from gpuyard.domain.sites import Held, Wan, least_copied

# Tiresias' discretized 2D-LAS queue thresholds, in GPU-seconds of attained service.
LAS_THRESHOLDS = (3250.0, 7200.0)


def las_queue(attained_gpu_s: float) -> int:
    """0 for the least-served work; work moves down a queue as it receives service."""
    return bisect_right(LAS_THRESHOLDS, attained_gpu_s)  # thresholds reached


@dataclass(frozen=True)
class Elastic:
    """An elastic job (`resources.gpus: {min, max}`) as the cycle sizes it: its predicted goodput
    (steps per second) at each size it may take now, smallest first, and the share of a resize's
    horizon its restart leaves (`domain.elastic.keep_factor`). `scheduler/sizing.py` builds it from
    the step times its attempts reported."""

    min_gpus: int  # its range's min: it never holds less, and what it holds above is its surplus
    goodput: tuple[tuple[int, float], ...]
    keep: float


@dataclass(frozen=True)
class PendingJob:
    """A job waiting for an attempt. Carries no duration: scheduling is non-clairvoyant."""

    id: str
    team: str
    gpus: int
    nodes: int
    gpu_types: tuple[str, ...]
    priority: int
    preemptible: bool
    submitted_at: datetime
    gpu_memory_gb: float = 0.0
    cpu: float = 0.0  # per node
    memory_gb: float = 0.0  # per node
    sites: tuple[str, ...] = ()
    tolerations: tuple[str, ...] = ()
    data_uris: tuple[str, ...] = ()
    checkpoint_site: str | None = None  # where its newest checkpoint is, if any
    attained_gpu_s: float = 0.0  # service received so far (for least-attained-service policies)
    # The site its team submits it at; None: no site is its own.
    home_site: str | None = None
    checkpoint_bytes: float = 0.0  # the size of its newest checkpoint; 0: none, or not known
    data: tuple[Held, ...] = ()  # what it reads that some sites hold, with its size (0: not known)
    queued_at: datetime | None = None  # when it last joined the queue; None: at its submission
    elastic: Elastic | None = None  # None: one size, `gpus`; else `gpus` is its min
    # What the filters read of the job, derived once: jobs of one shape fit (or not) on the same nodes.
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False)
    las: int = field(init=False, repr=False, compare=False)  # its 2D-LAS queue
    # Oldest first, ties by id: POSIX seconds compare several times faster than aware datetimes, and
    # queues run to thousands of jobs sorted every cycle.
    age: tuple[float, str] = field(init=False, repr=False, compare=False)
    # Everything but its age that the cycle's rules read of a job: jobs of one kind fare alike.
    kind: tuple[object, ...] = field(init=False, repr=False, compare=False)
    # What a start copies to its site first unless a copy lies there: its checkpoint and its data.
    needs: tuple[Held, ...] = field(init=False, repr=False, compare=False)
    # Its own site: of those holding its checkpoint or data and its home (that it may run at), where
    # a start copies least (ties: its checkpoint's, its home, its data's); None: no site is its own.
    own_site: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = (
            self.gpu_types,
            self.gpu_memory_gb,
            self.cpu,
            self.memory_gb,
            self.sites,
            self.tolerations,
            self.data_uris,
            self.preemptible,
            self.gpus_per_node,
            self.nodes,
        )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "las", las_queue(self.attained_gpu_s))
        object.__setattr__(self, "age", (self.submitted_at.timestamp(), self.id))
        object.__setattr__(self, "kind", (self.team, shape, self.priority, self.las))
        needs = self.data
        if self.checkpoint_site is not None:
            needs = (*needs, Held(self.checkpoint_bytes, (self.checkpoint_site,)))
        object.__setattr__(self, "needs", needs)
        named = (self.checkpoint_site, self.home_site, *(s for held in self.data for s in held.sites))
        own = [s for s in dict.fromkeys(named) if s is not None and (not self.sites or s in self.sites)]
        object.__setattr__(self, "own_site", least_copied(own, needs))

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    def waited_s(self, now: datetime) -> float:
        """How long it has been queued this time (since it joined the queue, or was requeued)."""
        return max(0.0, (now - (self.queued_at or self.submitted_at)).total_seconds())


@dataclass(frozen=True)
class RunningAttempt:
    attempt_id: str
    job_id: str
    team: str
    priority: int
    preemptible: bool
    placement: Placement
    started_at: datetime
    last_checkpoint_at: datetime | None
    borrowed: bool = False  # admitted on quota lent by the team's cohort
    cpu: float = 0.0  # per node, as its job asked
    memory_gb: float = 0.0  # per node
    attained_gpu_s: float = 0.0
    stopping: bool = False  # already asked to stop
    # When its job was submitted; None (a snapshot that does not carry it) ranks it as the youngest
    # job: never starving, and after any pending job in an age order.
    submitted_at: datetime | None = None
    elastic: Elastic | None = None  # an elastic job's sizes (None: a fixed-size job)
    # Derived once (every cycle reads them for every attempt): GPUs, as POSIX seconds its start, its
    # job's submission and when its progress was last durable (its newest checkpoint, or its start),
    # and its 2D-LAS queue.
    gpus: int = field(init=False, repr=False, compare=False)
    started_s: float = field(init=False, repr=False, compare=False)
    age: tuple[float, str] = field(init=False, repr=False, compare=False)  # its job's, as PendingJob.age
    saved_s: float = field(init=False, repr=False, compare=False)
    las: int = field(init=False, repr=False, compare=False)  # its 2D-LAS queue
    # An elastic job's min per node (its min split evenly over its nodes, as every size is), and the
    # GPUs it holds above it: what a shrink takes back. 0 and 0 for a fixed-size job.
    kept_per_node: int = field(init=False, repr=False, compare=False)
    surplus: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        saved = max(self.started_at, self.last_checkpoint_at or self.started_at)
        object.__setattr__(self, "las", las_queue(self.attained_gpu_s))
        object.__setattr__(self, "gpus", self.placement.gpus)
        object.__setattr__(self, "started_s", self.started_at.timestamp())
        submitted_s = self.submitted_at.timestamp() if self.submitted_at else math.inf
        object.__setattr__(self, "age", (submitted_s, self.job_id))
        object.__setattr__(self, "saved_s", saved.timestamp())
        kept = self.elastic.min_gpus // len(self.placement.slices) if self.elastic is not None else 0
        object.__setattr__(self, "kept_per_node", kept)
        surplus = self.gpus - kept * len(self.placement.slices) if self.elastic is not None else 0
        object.__setattr__(self, "surplus", max(surplus, 0))

    def unsaved_gpu_s(self, now: datetime) -> float:
        """Progress a preemption would lose now: GPU-seconds since the last durable checkpoint."""
        return max(0.0, now.timestamp() - self.saved_s) * self.gpus


DomainKey = tuple[str, str, str]
# Per job shape (and its team's allowed GPU types): each domain with enough nodes that pass the
# filters, and those nodes.
Eligible = dict[tuple[object, ...], dict[DomainKey, list[Node]]]


class FleetIndex:
    """What cycles derive from a fleet alone, built once per fleet by whoever runs them (the scheduler
    service, the simulator) and shared by every snapshot of that fleet: nodes by name, domains, the
    highest price, and which nodes pass a policy's filters per job shape. Filters read no free GPUs
    (`plugins`), so their answers hold from one cycle to the next; the cycle fills them in."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.nodes: dict[str, Node] = {node.name: node for node in fleet.nodes}
        self.domains: dict[DomainKey, list[Node]] = fleet.domains()
        self.highest_price = max((n.price_per_gpu_hour for n in fleet.nodes), default=0.0)
        self.gpus = sum(n.gpus for n in fleet.nodes)
        self.sites: tuple[str, ...] = tuple(sorted(fleet.site_names))
        self._eligible: dict[tuple[str, ...], Eligible] = {}

    def eligible(self, filters: tuple[str, ...]) -> Eligible:
        """The eligible nodes found so far under these filters (by name), for the cycle to read and fill."""
        return self._eligible.setdefault(filters, {})


@dataclass
class ClusterState:
    """Free GPUs per node and the host CPU and memory in use, mutated as the cycle reserves; usage per
    team for quota and fair share."""

    index: FleetIndex
    free: dict[str, set[int]]
    quotas: dict[str, TeamQuota]
    running: list[RunningAttempt] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)  # GPUs held per team
    borrowed: dict[str, int] = field(default_factory=dict)  # of which borrowed from the cohort
    host_used: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (CPU, memory GB)
    wan: Wan | None = None  # the link between its sites, where its owner models one (site rules read it)
    copies: dict[tuple[str, str], int] = field(default_factory=dict)  # (from, to) site -> copies under way

    def __post_init__(self) -> None:
        self.nodes = self.index.nodes
        self.domains = self.index.domains
        self.highest_price = self.index.highest_price
        # Free GPUs per domain, counted on first use and kept by take/give_back: read for every
        # candidate placement. Change `free` directly only before that first use (snapshot building).
        self._domain_free: dict[DomainKey, int] | None = None

    @property
    def fleet(self) -> Fleet:
        return self.index.fleet

    def fleet_domain(self, node: Node) -> list[Node]:
        return self.domains[node.domain_key]

    def free_in(self, nodes: list[Node]) -> int:
        return sum(len(self.free[n.name]) for n in nodes)

    def domain_free(self) -> dict[DomainKey, int]:
        if self._domain_free is None:
            self._domain_free = {d: self.free_in(nodes) for d, nodes in self.domains.items()}
        return self._domain_free

    def _count(self, placement: Placement, change: int) -> None:
        if self._domain_free is not None:
            self._domain_free[(placement.site, placement.cluster, placement.domain)] += change

    @classmethod
    def empty(cls, index: FleetIndex, quotas: dict[str, TeamQuota]) -> ClusterState:
        return cls(index=index, free={n.name: set(range(n.gpus)) for n in index.fleet.nodes}, quotas=quotas)

    def host_room(self, node: Node, cpu: float, memory_gb: float) -> bool:
        """`node` has `cpu` and `memory_gb` left beside what its attempts use (as far as it says)."""
        used_cpu, used_memory = self.host_used.get(node.name, (0.0, 0.0))
        return holds_host_resources(node, used_cpu + cpu, used_memory + memory_gb)

    def use_host(self, placement: Placement, cpu: float, memory_gb: float) -> None:
        """Count `cpu` and `memory_gb` (negative: give back) on each node of `placement`."""
        if cpu or memory_gb:
            for piece in placement.slices:
                used_cpu, used_memory = self.host_used.get(piece.node, (0.0, 0.0))
                self.host_used[piece.node] = (used_cpu + cpu, used_memory + memory_gb)

    def take(
        self, team: str, placement: Placement, *, borrowed: bool, cpu: float = 0.0, memory_gb: float = 0.0
    ) -> None:
        """Reserve the placement's GPUs, and `cpu` and `memory_gb` on each of its nodes."""
        for piece in placement.slices:
            missing = set(piece.gpu_indices) - self.free[piece.node]
            if missing:
                raise ValueError(f"GPUs {sorted(missing)} of {piece.node} are not free")
            self.free[piece.node] -= set(piece.gpu_indices)
        self.use_host(placement, cpu, memory_gb)
        self._count(placement, -placement.gpus)
        self.usage[team] = self.usage.get(team, 0) + placement.gpus
        if borrowed:
            self.borrowed[team] = self.borrowed.get(team, 0) + placement.gpus

    def give_back(
        self, team: str, placement: Placement, *, borrowed: bool, cpu: float = 0.0, memory_gb: float = 0.0
    ) -> None:
        for piece in placement.slices:
            self.free[piece.node] |= set(piece.gpu_indices)
        self.use_host(placement, -cpu, -memory_gb)
        self._count(placement, placement.gpus)
        self.usage[team] = self.usage.get(team, 0) - placement.gpus
        if borrowed:
            self.borrowed[team] = self.borrowed.get(team, 0) - placement.gpus

    def quota(self, team: str) -> TeamQuota:
        return self.quotas.get(team) or TeamQuota(gpu_quota=0)


@dataclass
class Cohort:
    """Teams that lend each other idle quota (Kueue's cohort)."""

    members: list[str]
    nominal: int  # the sum of its members' nominal quotas
    used: int  # GPUs its members hold; the cycle adds what it places


Cohorts = dict[str, Cohort]


def cohorts_of(state: ClusterState) -> Cohorts:
    found: Cohorts = {}
    for team, q in state.quotas.items():
        if q.cohort is not None:
            cohort = found.setdefault(q.cohort, Cohort([], 0, 0))
            cohort.members.append(team)
            cohort.nominal += q.gpu_quota
            cohort.used += state.usage.get(team, 0)
    return found
