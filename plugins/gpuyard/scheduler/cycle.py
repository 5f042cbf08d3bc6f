"""One scheduling cycle: order the queue, admit, filter -> score -> reserve, preempt when needed.

Pure: it reads a snapshot and returns decisions, mutating only the snapshot's free GPUs and usage
as it reserves. The service turns the decisions into transactions and launches; the simulator
applies them to its virtual cluster. Both run this same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuyard.domain.elastic import Sizing
from gpuyard.domain.fleet import Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.placements import Choose
from gpuyard.scheduler.plugins import room_now
from gpuyard.scheduler.policy import Policy
from gpuyard.scheduler.preemption import SHRINK, Preemption
from gpuyard.scheduler.sites import ANYWHERE, Where
from gpuyard.scheduler.sizing import growth
from gpuyard.scheduler.snapshot import (
    ClusterState,
    Cohorts,
    DomainKey,
    PendingJob,
    RunningAttempt,
    cohorts_of,
)

# Like kube-scheduler's percentageOfNodesToScore: stop looking once this many feasible domains
# were found, so a cycle over thousands of nodes stays fast. Domains are visited best-fit first.
CANDIDATE_DOMAINS = 32


# Why a job waits, when it neither starts nor finds victims.
OVER_QUOTA = "over quota, and the cohort has no idle quota to lend"
NO_ROOM = "no domain has room for the whole gang now"
NO_ROOM_AT_SITE = (
    "no domain of the site holding its checkpoint or data has room now, and it does not move yet"
)
STOPPING = "waiting for preempted attempts to stop"
# A job waiting for one of these would be kept waiting by idle GPUs given to elastic jobs.
FOR_ROOM = frozenset((NO_ROOM, NO_ROOM_AT_SITE, STOPPING))
GROW = "grow"  # the rule an elastic job's resize to a larger size is evicted by


@dataclass(frozen=True)
class Placed:
    job: PendingJob
    placement: Placement
    borrowed: bool


@dataclass(frozen=True)
class Eviction:
    attempt: RunningAttempt
    for_job: str
    rule: str  # the name of the preemption rule (preemption.RULES)
    reason: str


@dataclass
class CycleResult:
    placed: list[Placed] = field(default_factory=list)
    evicted: list[Eviction] = field(default_factory=list)
    reserved_for: dict[str, DomainKey] = field(default_factory=dict)  # job id -> domain held for it
    # job id -> why it did not start (without backfill, the jobs after the first that does not fit
    # are not looked at)
    waiting: dict[str, str] = field(default_factory=dict)


def admit(job: PendingJob, state: ClusterState, cohorts: Cohorts | None = None) -> str | None:
    """'nominal' within the team's quota, 'borrow' on idle quota of its cohort, else None.

    `cohorts` (`cohorts_of(state)`, kept up to date by the caller) may be passed precomputed.
    """
    return admit_gpus(job.team, job.gpus, state, cohorts)


def admit_gpus(team: str, gpus: int, state: ClusterState, cohorts: Cohorts | None = None) -> str | None:
    """`admit` for `gpus` more GPUs of `team`."""
    quota = state.quota(team)
    if state.usage.get(team, 0) + gpus <= quota.gpu_quota:
        return "nominal"
    if quota.cohort is None:
        return None
    cohort = (cohorts if cohorts is not None else cohorts_of(state))[quota.cohort]
    return "borrow" if cohort.used + gpus <= cohort.nominal else None


class _Eligibility:
    """Per cycle: eligible nodes per domain for a job shape, and an index of free GPUs per domain.

    Eligible nodes pass the policy's filters; the fleet index keeps them from one cycle to the next
    (`FleetIndex.eligible`). The free-GPU index buckets domains by free GPUs so the best-fit search
    visits only domains with room, and shapes that found no room are remembered: within one cycle
    GPUs are only taken and nodes only held, so a shape that did not fit will not fit later in the
    same cycle.
    """

    def __init__(self, state: ClusterState, policy: Policy):
        self.state = state
        self.filters = policy.filter_plugins
        self._cache = state.index.eligible(policy.filters)
        self.domain_free: dict[DomainKey, int] = dict(state.domain_free())
        self.buckets: dict[int, dict[DomainKey, None]] = {}
        for domain, count in self.domain_free.items():
            self.buckets.setdefault(count, {})[domain] = None
        self.no_room: set[tuple[object, ...]] = set()

    def key(self, job: PendingJob) -> tuple[object, ...]:
        return (self.state.quota(job.team).allowed_gpu_types, job.shape)

    def domains(self, job: PendingJob) -> dict[DomainKey, list[Node]]:
        key = self.key(job)
        found = self._cache.get(key)
        if found is None:
            found = {}
            for domain, nodes in self.state.domains.items():
                eligible = [
                    n
                    for n in nodes
                    if n.gpus >= job.gpus_per_node and all(f(job, n, self.state) for f in self.filters)
                ]
                if len(eligible) >= job.nodes:
                    found[domain] = eligible
            self._cache[key] = found
        return found

    def at_sites(self, job: PendingJob, sites: tuple[str, ...]) -> dict[DomainKey, list[Node]]:
        """The job's eligible domains at `sites`; kept across cycles with the fleet's other answers."""
        key = (self.key(job), sites)
        found = self._cache.get(key)
        if found is None:
            found = {d: nodes for d, nodes in self.domains(job).items() if d[0] in sites}
            self._cache[key] = found
        return found

    def with_room(self, gpus: int) -> list[DomainKey]:
        """Domains with at least `gpus` free GPUs, fewest free first (best fit)."""
        return [d for count in sorted(self.buckets) if count >= gpus for d in self.buckets[count]]

    def taken(self, placement: Placement, gpus: int | None = None) -> None:
        """The placement's GPUs (or `gpus` of its domain: negative, given back) were taken."""
        domain = (placement.site, placement.cluster, placement.domain)
        before = self.domain_free[domain]
        after = before - (placement.gpus if gpus is None else gpus)
        del self.buckets[before][domain]
        self.buckets.setdefault(after, {})[domain] = None
        self.domain_free[domain] = after


def _choose_nodes(
    job: PendingJob, nodes: list[Node], state: ClusterState, held: set[str]
) -> list[Node] | None:
    fitting = [n for n in nodes if n.name not in held and room_now(job, n, state)]
    if len(fitting) < job.nodes:
        return None
    return sorted(fitting, key=lambda n: (len(state.free[n.name]), n.name))[: job.nodes]  # best fit


def _score(job: PendingJob, nodes: list[Node], state: ClusterState, policy: Policy) -> float:
    return sum(weight * score(job, nodes, state) for weight, score in policy.score_plugins)


def _placement(job: PendingJob, nodes: list[Node], state: ClusterState) -> Placement:
    first = nodes[0]
    return Placement(
        site=first.site,
        cluster=first.cluster,
        domain=first.domain,
        slices=tuple(
            NodeSlice(n.name, tuple(sorted(state.free[n.name])[: job.gpus_per_node])) for n in nodes
        ),
    )


def place(
    job: PendingJob,
    state: ClusterState,
    eligibility: _Eligibility,
    held: set[str],
    policy: Policy,
    domains: dict[DomainKey, list[Node]] | None = None,
    shape: tuple[object, ...] | None = None,
) -> Placement | None:
    """Filter -> score: the best placement of the whole gang inside ONE domain, or None. Among
    `domains` (default: all the job's eligible ones), whose answers the cycle remembers by `shape`
    (default: the job's)."""
    if domains is None:
        domains = eligibility.domains(job)
    if job.gpus == 0:
        return None if not domains else _placement(job, next(iter(domains.values()))[: job.nodes], state)
    if shape is None:
        shape = eligibility.key(job)
    if shape in eligibility.no_room:
        return None
    candidates: list[list[Node]] = []
    for domain in eligibility.with_room(job.gpus):  # best fit: fewest free GPUs first
        nodes = domains.get(domain)
        if nodes is None:
            continue
        if len(nodes) < len(state.domains[domain]) and state.free_in(nodes) < job.gpus:
            continue  # (a domain of eligible nodes only has room: `with_room`)
        chosen = _choose_nodes(job, nodes, state, held)
        if chosen:
            candidates.append(chosen)
            if len(candidates) >= CANDIDATE_DOMAINS:
                break
    if not candidates:
        eligibility.no_room.add(shape)
        return None
    # Ties go to the earliest candidate, which is the best fit.
    _, best = max(enumerate(candidates), key=lambda item: (_score(job, item[1], state, policy), -item[0]))
    return _placement(job, best, state)


def _chosen(
    job: PendingJob,
    state: ClusterState,
    eligibility: _Eligibility,
    held: set[str],
    choose: Choose,
    domains: dict[DomainKey, list[Node]] | None = None,
    shape: tuple[object, ...] | None = None,
) -> Placement | None:
    """A placement by a rule of its own (`placements.PLACEMENTS`), with the cycle's no-room memo;
    `domains` and `shape` as `place` has them."""
    if shape is None:
        shape = eligibility.key(job)
    if shape in eligibility.no_room:
        return None
    found = choose(job, state, eligibility.domains(job) if domains is None else domains, held)
    if found is None:
        eligibility.no_room.add(shape)
    return found


# Domains searched for a job, and the key the cycle remembers the answer by.
Search = tuple[dict[DomainKey, list[Node]], tuple[object, ...]]


def _searches(job: PendingJob, where: Where, eligibility: _Eligibility) -> list[Search]:
    """The domains searched for the job, in turn, each with the key the cycle remembers its answer
    by: all of them, or its own site's and then those of the sites it may move to."""
    if where.site is None:
        return [(eligibility.domains(job), eligibility.key(job))]
    key = eligibility.key(job)
    groups = [(where.site,), where.moves] if where.moves else [(where.site,)]
    return [(eligibility.at_sites(job, sites), (key, sites)) for sites in groups]


def _find(
    job: PendingJob,
    searches: list[Search],
    state: ClusterState,
    eligibility: _Eligibility,
    held: set[str],
    policy: Policy,
) -> Placement | None:
    """The first placement found by the policy's placement rule, search after search."""
    choose = policy.placement_rule.choose
    for domains, shape in searches:
        found = (
            place(job, state, eligibility, held, policy, domains, shape)
            if choose is None
            else _chosen(job, state, eligibility, held, choose, domains, shape)
        )
        if found is not None:
            return found
    return None


def reservation(job: PendingJob, nodes: list[Node], state: ClusterState) -> set[str]:
    """The nodes held for a gang that does not fit yet: the `job.nodes` eligible nodes of its domain
    with the most free GPUs. Only those, not the whole domain: other nodes stay open to backfill."""
    emptiest = sorted(nodes, key=lambda n: (-len(state.free[n.name]), n.name))
    return {n.name for n in emptiest[: job.nodes]}


def run_cycle(pending: list[PendingJob], state: ClusterState, now: datetime, policy: Policy) -> CycleResult:
    result = CycleResult()
    eligibility = _Eligibility(state, policy)
    guard = policy.starvation
    demand = (
        guard.demand(sum(j.gpus for j in pending), sum(state.usage.values()), state.index.gpus)
        if guard is not None
        else 1.0
    )
    starving = guard.starving_jobs(pending, state, now, demand) if guard is not None else frozenset()
    preemption = Preemption(
        state,
        now,
        policy.rules,
        quota=policy.quota,
        guard=guard,
        starving=starving,
        demand=demand,
        min_run_s=policy.min_run_s,
    )
    # Shrink before preempt: elastic jobs' surplus is searched first, by a search of its own.
    sizing = policy.sizing_rule
    shrinking = (
        Preemption(state, now, (SHRINK,), quota=policy.quota, guard=None, starving=frozenset())
        if sizing.shrinks and any(a.surplus for a in state.running)
        else None
    )
    held: set[str] = set()  # nodes reserved for a waiting job: nobody else may start there
    preempting = policy.preempts
    cohorts = cohorts_of(state)
    # Jobs alike (same kind and admission) that could not start, and why. Within a cycle GPUs are
    # only taken and nodes only held, so a later one fails alike: a long queue of similar jobs costs
    # one search, not one each.
    failed: dict[tuple[object, ...], str] = {}
    # Admission per (team, GPUs), until a placement changes the usage it reads.
    admissions: dict[tuple[str, int], str | None] = {}
    # Kinds that failed since the last placement, and why: their later jobs would fail alike, and
    # wait without a look (a backlog of thousands then costs a lookup per job and a search per kind).
    parked: dict[tuple[object, ...], str] = {}
    sited = len(state.index.sites) > 1  # site rules apply between sites (scheduler/sites.py)
    for job in policy.order(pending, state, now, starving):
        where = policy.site_rule.where(job, state, now) if sited else ANYWHERE
        # A starving job has rights its kind's others lack; where it may go decides where it finds room.
        kind: tuple[object, ...] = (job.kind, job.id in starving)
        if where.site is not None:
            kind = (*kind, where)
        if (why := parked.get(kind)) is not None:
            result.waiting[job.id] = why
            continue
        admitted: str | None = "nominal"
        if policy.quota:
            asked = (job.team, job.gpus)
            if asked not in admissions:
                admissions[asked] = admit(job, state, cohorts)
            admitted = admissions[asked]
        alike = (kind, admitted)
        if alike in failed:
            result.waiting[job.id] = parked[kind] = failed[alike]
            if not policy.backfill:
                break
            continue
        placement = None
        searches = _searches(job, where, eligibility)
        if admitted is not None:
            placement = _find(job, searches, state, eligibility, held, policy)
        if placement is not None:
            state.take(
                job.team, placement, borrowed=admitted == "borrow", cpu=job.cpu, memory_gb=job.memory_gb
            )
            if (cohort := state.quota(job.team).cohort) is not None:
                cohorts[cohort].used += placement.gpus
            eligibility.taken(placement)
            admissions.clear()
            parked.clear()  # admissions changed
            result.placed.append(Placed(job, placement, borrowed=admitted == "borrow"))
            continue
        found = None
        own, own_shape = searches[0]  # victims and reservations only at its own site
        if shrinking is not None:
            found = shrinking.victims(job, admitted, own_shape, own, held, cohorts)
        if found is None and preempting:
            found = preemption.victims(job, admitted, own_shape, own, held, cohorts)
        if found is not None:
            nodes, victims = found
            for victim in victims:
                if not victim.attempt.stopping:
                    result.evicted.append(Eviction(victim.attempt, job.id, victim.rule, victim.reason))
            for search in (preemption, shrinking):
                if search is not None:
                    search.mark_stopping([v.attempt for v in victims])
            held.update(nodes)
            result.reserved_for[job.id] = state.nodes[nodes[0]].domain_key
            result.waiting[job.id] = STOPPING
            continue
        if admitted is None:
            result.waiting[job.id] = failed[alike] = parked[kind] = OVER_QUOTA
            continue
        why = NO_ROOM_AT_SITE if where.site is not None and not where.moves else NO_ROOM
        result.waiting[job.id] = failed[alike] = parked[kind] = why
        if policy.reserve_head and not result.reserved_for and job.nodes * job.gpus_per_node > 1:
            domains = own
            if domains:
                domain = max(domains, key=lambda d: (state.free_in(domains[d]), d))
                held |= reservation(job, domains[domain], state)
                result.reserved_for[job.id] = domain
        if not policy.backfill:
            break
    if sizing.grows and not FOR_ROOM.intersection(result.waiting.values()):
        _grow(result, state, now, eligibility, policy, cohorts)
    return result


def _grow(
    result: CycleResult,
    state: ClusterState,
    now: datetime,
    eligibility: _Eligibility,
    policy: Policy,
    cohorts: Cohorts,
) -> None:
    """Idle GPUs to elastic jobs, once no job waits for room: `sizing.growth` says which sizes are
    worth trying. A job placed this cycle (starting anyway) is placed again at the largest that finds
    room by the policy's rule; a running attempt grows on its own nodes (each node its even share
    more), asked to stop so that its next attempt starts at that size."""
    placed = {p.job.id: i for i, p in enumerate(result.placed) if p.job.elastic is not None}
    running = {a.job_id: a for a in state.running if a.elastic is not None and not a.stopping}
    idle = sum(eligibility.domain_free.values())
    if not (placed or running) or idle == 0:
        return
    rows = [
        Sizing(p.job.id, dict(p.job.elastic.goodput), 0, p.job.elastic.keep, p.placement.gpus)
        for p in (result.placed[i] for i in placed.values())
        if p.job.elastic is not None and p.placement.gpus in dict(p.job.elastic.goodput)
    ] + [
        Sizing(a.job_id, dict(a.elastic.goodput), a.gpus, a.elastic.keep, a.gpus)
        for a in running.values()
        if a.elastic is not None and a.gpus in dict(a.elastic.goodput)
    ]
    sited = len(state.index.sites) > 1
    for job_id, tries in growth(rows, idle).items():
        if job_id in placed:
            _replace_larger(result, placed[job_id], tries, state, now, eligibility, policy, cohorts, sited)
        else:
            _grow_in_place(result, running[job_id], tries, state, eligibility, policy, cohorts)


def _replace_larger(
    result: CycleResult,
    index: int,
    tries: list[int],
    state: ClusterState,
    now: datetime,
    eligibility: _Eligibility,
    policy: Policy,
    cohorts: Cohorts,
    sited: bool,
) -> None:
    """Place a job placed this cycle again at the first size of `tries` that is admitted and finds
    room; else where it was."""
    placed = result.placed[index]
    job = placed.job
    _give(state, eligibility, cohorts, job, placed.placement, placed.borrowed, back=True)
    for gpus in tries:
        larger = replace(job, gpus=gpus)
        admitted = admit(larger, state, cohorts) if policy.quota else "nominal"
        if admitted is None:
            continue
        where = policy.site_rule.where(larger, state, now) if sited else ANYWHERE
        found = _find(larger, _searches(larger, where, eligibility), state, eligibility, set(), policy)
        if found is not None:
            _give(state, eligibility, cohorts, larger, found, admitted == "borrow", back=False)
            result.placed[index] = Placed(larger, found, borrowed=admitted == "borrow")
            return
    _give(state, eligibility, cohorts, job, placed.placement, placed.borrowed, back=False)


def _grow_in_place(
    result: CycleResult,
    attempt: RunningAttempt,
    tries: list[int],
    state: ClusterState,
    eligibility: _Eligibility,
    policy: Policy,
    cohorts: Cohorts,
) -> None:
    """Ask a running attempt to stop for the first size of `tries` its nodes have room for (and its
    team quota): the GPUs it will take are held for it in this cycle's snapshot."""
    nodes = attempt.placement.slices
    for gpus in tries:
        more = gpus // len(nodes) - len(nodes[0].gpu_indices)
        if any(len(state.free[piece.node]) < more for piece in nodes):
            continue
        if policy.quota and admit_gpus(attempt.team, gpus - attempt.gpus, state, cohorts) is None:
            continue
        extra = replace(
            attempt.placement,
            slices=tuple(NodeSlice(p.node, tuple(sorted(state.free[p.node])[:more])) for p in nodes),
        )
        state.take(attempt.team, extra, borrowed=False)
        eligibility.taken(extra)
        if (cohort := state.quota(attempt.team).cohort) is not None:
            cohorts[cohort].used += extra.gpus
        reason = f"resize: its elastic job grows from {attempt.gpus} to {gpus} GPUs"
        result.evicted.append(Eviction(attempt, attempt.job_id, GROW, reason))
        return


def _give(
    state: ClusterState,
    eligibility: _Eligibility,
    cohorts: Cohorts,
    job: PendingJob,
    placement: Placement,
    borrowed: bool,
    *,
    back: bool,
) -> None:
    """Give `placement` back (`back`) or take it, in the snapshot, the free index and the cohort."""
    if back:
        state.give_back(job.team, placement, borrowed=borrowed, cpu=job.cpu, memory_gb=job.memory_gb)
    else:
        state.take(job.team, placement, borrowed=borrowed, cpu=job.cpu, memory_gb=job.memory_gb)
    eligibility.taken(placement, -placement.gpus if back else placement.gpus)
    if (cohort := state.quota(job.team).cohort) is not None:
        cohorts[cohort].used += -placement.gpus if back else placement.gpus
