"""One scheduling cycle: order the queue, admit, filter -> score -> reserve, preempt when needed.

Pure: it reads a snapshot and returns decisions, mutating only the snapshot's free GPUs and usage
as it reserves. The service turns the decisions into transactions and launches; the simulator
applies them to its virtual cluster. Both run this same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple

from gpuyard.domain.fleet import Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.plugins import SCORES, STATIC_FILTERS, free_gpus
from gpuyard.scheduler.policy import Policy
from gpuyard.scheduler.snapshot import ClusterState, PendingJob, RunningAttempt

DomainKey = tuple[str, str, str]

# Like kube-scheduler's percentageOfNodesToScore: stop looking once this many feasible domains
# were found, so a cycle over thousands of nodes stays fast. Domains are visited best-fit first.
CANDIDATE_DOMAINS = 32


# Why a job waits, when it neither starts nor finds victims.
OVER_QUOTA = "over quota, and the cohort has no idle quota to lend"
NO_ROOM = "no domain has room for the whole gang now"

# An attempt runs at least this long before fair-share rules (reclaim, least attained service) may
# evict it; only a higher priority class may evict it sooner. Without a quantum, a just-placed
# attempt costs nothing to evict, and two rules can evict and re-place each other in one instant.
MIN_RUN_S = 120.0


@dataclass(frozen=True)
class Placed:
    job: PendingJob
    placement: Placement
    borrowed: bool


@dataclass(frozen=True)
class Eviction:
    attempt: RunningAttempt
    for_job: str
    reason: str


@dataclass
class CycleResult:
    placed: list[Placed] = field(default_factory=list)
    evicted: list[Eviction] = field(default_factory=list)
    reserved_for: dict[str, DomainKey] = field(default_factory=dict)  # job id -> domain held for it
    # job id -> why it did not start (without backfill, the jobs after the first that does not fit
    # are not looked at)
    waiting: dict[str, str] = field(default_factory=dict)


@dataclass
class Cohort:
    members: list[str]
    nominal: int  # the sum of its members' nominal quotas
    used: int  # GPUs its members hold; the cycle adds what it places


Cohorts = dict[str, Cohort]


def admit(job: PendingJob, state: ClusterState, cohorts: Cohorts | None = None) -> str | None:
    """'nominal' within the team's quota, 'borrow' on idle quota of its cohort, else None.

    `cohorts` (`cohorts_of(state)`, kept up to date by the caller) may be passed precomputed.
    """
    quota = state.quota(job.team)
    if state.usage.get(job.team, 0) + job.gpus <= quota.gpu_quota:
        return "nominal"
    if quota.cohort is None:
        return None
    cohort = (cohorts if cohorts is not None else cohorts_of(state))[quota.cohort]
    return "borrow" if cohort.used + job.gpus <= cohort.nominal else None


def cohorts_of(state: ClusterState) -> Cohorts:
    found: Cohorts = {}
    for team, q in state.quotas.items():
        if q.cohort is not None:
            cohort = found.setdefault(q.cohort, Cohort([], 0, 0))
            cohort.members.append(team)
            cohort.nominal += q.gpu_quota
            cohort.used += state.usage.get(team, 0)
    return found


# Static filter results per (fleet, job shape): they read only node properties, the job's shape and
# its team's allowed GPU types, so they hold across cycles. A few fleets at most are remembered.
_STATIC: dict[int, tuple[object, dict[tuple[object, ...], dict[DomainKey, list[Node]]]]] = {}


def _static_cache(state: ClusterState) -> dict[tuple[object, ...], dict[DomainKey, list[Node]]]:
    entry = _STATIC.get(id(state.fleet))
    if entry is None or entry[0] is not state.fleet:
        if len(_STATIC) >= 4:
            _STATIC.pop(next(iter(_STATIC)))
        entry = (state.fleet, {})
        _STATIC[id(state.fleet)] = entry
    return entry[1]


class _Eligibility:
    """Per cycle: eligible nodes per domain for a job shape, and an index of free GPUs per domain.

    The index buckets domains by free GPUs so the best-fit search visits only domains with room,
    and shapes that found no room are remembered: within one cycle GPUs are only taken and nodes
    only held, so a shape that did not fit will not fit later in the same cycle.
    """

    def __init__(self, state: ClusterState, now: datetime):
        self.state = state
        self.now = now
        self._cache = _static_cache(state)
        self.domain_free: dict[DomainKey, int] = {
            d: state.free_in(nodes) for d, nodes in state.domains.items()
        }
        self.buckets: dict[int, dict[DomainKey, None]] = {}
        for domain, count in self.domain_free.items():
            self.buckets.setdefault(count, {})[domain] = None
        self.no_room: set[tuple[object, ...]] = set()
        self.no_victims: set[tuple[object, ...]] = set()
        self._by_domain: dict[DomainKey, list[_Candidate]] | None = None
        self._bounds = _Bounds()
        self._stopping: dict[str, int] = {}  # GPUs per team of attempts already asked to stop

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
                    if n.gpus >= job.gpus_per_node and all(f(job, n, self.state) for _, f in STATIC_FILTERS)
                ]
                if len(eligible) >= job.nodes:
                    found[domain] = eligible
            self._cache[key] = found
        return found

    def with_room(self, gpus: int) -> list[DomainKey]:
        """Domains with at least `gpus` free GPUs, fewest free first (best fit)."""
        return [d for count in sorted(self.buckets) if count >= gpus for d in self.buckets[count]]

    def taken(self, placement: Placement) -> None:
        domain = (placement.site, placement.cluster, placement.domain)
        before = self.domain_free[domain]
        after = before - placement.gpus
        del self.buckets[before][domain]
        self.buckets.setdefault(after, {})[domain] = None
        self.domain_free[domain] = after

    def stopping_by_team(self) -> dict[str, int]:
        self.running_by_domain()
        return self._stopping

    def running_by_domain(self) -> dict[DomainKey, list[_Candidate]]:
        """Running attempts per domain with what every victim search reads of them, computed once
        per cycle; evictions update it (`mark_stopping`)."""
        if self._by_domain is None:
            self._by_domain = {}
            bounds = self._bounds
            now_s = self.now.timestamp()
            for attempt in self.state.running:
                p = attempt.placement
                settled = now_s - attempt.started_s >= MIN_RUN_S
                unsaved = max(0.0, now_s - attempt.saved_s) * attempt.gpus  # = unsaved_gpu_s(now)
                candidate = _Candidate(attempt, settled, unsaved)
                self._by_domain.setdefault((p.site, p.cluster, p.domain), []).append(candidate)
                if attempt.stopping:
                    bounds.stopping = True
                    self._stopping[attempt.team] = self._stopping.get(attempt.team, 0) + attempt.gpus
                elif attempt.preemptible:
                    bounds.lowest_priority = min(bounds.lowest_priority, attempt.priority)
                    if settled:
                        bounds.most_served = max(bounds.most_served, attempt.las)
                        bounds.borrowed = bounds.borrowed or attempt.borrowed
        return self._by_domain

    def mark_stopping(self, victims: list[RunningAttempt]) -> None:
        """The victims were asked to stop: later searches of this cycle count them as free-to-come."""
        by_domain = self.running_by_domain()
        ids = {v.attempt_id for v in victims if not v.stopping}
        if not ids:
            return
        for victim in victims:
            if victim.attempt_id in ids:
                p = victim.placement
                candidates = by_domain[(p.site, p.cluster, p.domain)]
                for i, c in enumerate(candidates):
                    if c.attempt.attempt_id == victim.attempt_id:
                        candidates[i] = c._replace(attempt=replace(c.attempt, stopping=True))
                self._stopping[victim.team] = self._stopping.get(victim.team, 0) + victim.gpus
        self._bounds.stopping = True  # the other bounds stay upper bounds
        self.state.running = [
            replace(a, stopping=True) if a.attempt_id in ids else a for a in self.state.running
        ]

    def may_find_victims(self, job: PendingJob, policy: Policy, admitted: str | None) -> bool:
        """False when no running attempt can be a victim of `job` under any rule: a cheap test
        before searching the domains."""
        self.running_by_domain()
        b = self._bounds
        return (
            b.stopping
            or (policy.preempt_priority and b.lowest_priority < job.priority)
            or (policy.preempt_las and job.las < b.most_served)
            or (policy.reclaim and admitted == "nominal" and b.borrowed)
        )


class _Candidate(NamedTuple):  # a tuple: thousands are built per cycle
    attempt: RunningAttempt
    settled: bool  # ran at least MIN_RUN_S: fair-share rules may evict it
    unsaved_gpu_s: float


@dataclass
class _Bounds:
    """Over the running attempts: what any victim search could find at best."""

    stopping: bool = False
    lowest_priority: float = float("inf")  # among preemptible attempts
    most_served: int = -1  # highest 2D-LAS queue among settled preemptible attempts
    borrowed: bool = False  # a settled preemptible attempt runs on borrowed quota


def _choose_nodes(
    job: PendingJob, nodes: list[Node], state: ClusterState, held: set[str]
) -> list[Node] | None:
    fitting = [n for n in nodes if n.name not in held and free_gpus(job, n, state)]
    if len(fitting) < job.nodes:
        return None
    return sorted(fitting, key=lambda n: (len(state.free[n.name]), n.name))[: job.nodes]  # best fit


def _score(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
    return sum(s.weight * s.score(job, nodes, state) for s in SCORES)


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
    job: PendingJob, state: ClusterState, eligibility: _Eligibility, held: set[str]
) -> Placement | None:
    """Filter -> score: the best placement of the whole gang inside ONE domain, or None."""
    domains = eligibility.domains(job)
    if job.gpus == 0:
        return None if not domains else _placement(job, next(iter(domains.values()))[: job.nodes], state)
    shape = eligibility.key(job)
    if shape in eligibility.no_room:
        return None
    candidates: list[list[Node]] = []
    for domain in eligibility.with_room(job.gpus):  # best fit: fewest free GPUs first
        nodes = domains.get(domain)
        if nodes is None or state.free_in(nodes) < job.gpus:
            continue
        chosen = _choose_nodes(job, nodes, state, held)
        if chosen:
            candidates.append(chosen)
            if len(candidates) >= CANDIDATE_DOMAINS:
                break
    if not candidates:
        eligibility.no_room.add(shape)
        return None
    # Ties go to the earliest candidate, which is the best fit.
    _, best = max(enumerate(candidates), key=lambda item: (_score(job, item[1], state), -item[0]))
    return _placement(job, best, state)


def reservation(job: PendingJob, nodes: list[Node], state: ClusterState) -> set[str]:
    """The nodes held for a gang that does not fit yet: the `job.nodes` eligible nodes of its domain
    with the most free GPUs. Only those, not the whole domain: other nodes stay open to backfill."""
    emptiest = sorted(nodes, key=lambda n: (-len(state.free[n.name]), n.name))
    return {n.name for n in emptiest[: job.nodes]}


def _borrowing_without(victim: RunningAttempt, state: ClusterState) -> bool:
    """Would the victim's team still be at or above its nominal quota without this attempt?"""
    return state.usage.get(victim.team, 0) - victim.gpus >= state.quota(victim.team).gpu_quota


def _may_evict(
    job: PendingJob, victim: RunningAttempt, policy: Policy, admitted: str | None, state: ClusterState
) -> str | None:
    """Why `victim` may make room for `job`, or None.

    Evictions must agree with the queue order, or the victim, requeued, is placed back on the GPUs it
    just gave up and the two evict each other forever. gpuyard's order is priority class, then 2D-LAS
    queue, then within-quota before borrowing: so a less-served job may take a more-served attempt of
    any team, even one within its quota (as Tiresias shares the fleet), and a reclaim takes borrowed
    GPUs back only from work with at least as much service as the reclaiming job, and only from a
    team that stays at or above its quota (Kueue reclaims from ClusterQueues that are borrowing).
    Priority preemption keeps Kueue's borrowWithinCohort rule: a borrowing job outranks only
    borrowed GPUs.
    """
    if not victim.preemptible:
        return None
    outranks = policy.preempt_priority and victim.priority < job.priority
    less_served = policy.preempt_las and victim.priority <= job.priority and victim.las > job.las
    if admitted is None and victim.team == job.team:  # over quota and the cohort is full: the team
        # swaps GPUs within its own usage, for a higher class (Kueue's withinClusterQueue) or, under
        # LAS, for less-served work, as it would with another team's
        if outranks:
            return f"priority within team {job.team}: {job.id} outranks it"
        return f"least attained service: {job.id} has had less" if less_served else None
    # Another team's attempt, by class: a job within its quota may take it, a borrowing job (or one
    # waiting for the cohort to have room) only from a team that would still be borrowing without it.
    if outranks and (not policy.quota or admitted == "nominal" or _borrowing_without(victim, state)):
        return f"priority: {job.id} outranks it"
    if less_served:
        return f"least attained service: {job.id} has had less"
    if (
        policy.reclaim
        and admitted == "nominal"
        and victim.borrowed
        and (not policy.preempt_las or victim.las >= job.las)
        and _borrowing_without(victim, state)
    ):
        return f"reclaim: team {job.team} needs its quota back"
    return None


def _victims(
    job: PendingJob,
    state: ClusterState,
    now: datetime,
    policy: Policy,
    admitted: str | None,
    eligibility: _Eligibility,
    held: set[str],
    cohorts: Cohorts,
) -> tuple[list[str], list[tuple[RunningAttempt, str]]] | None:
    """The nodes the gang will use and the victim set that makes room there, losing the least
    unsaved progress.

    Attempts already stopping count as free-to-come at no cost, so a job waiting on its victims
    never asks for more. A job over quota whose cohort is full (`admitted` None) also needs its
    victims to give back enough of the cohort's quota to be admitted once they stop.
    """
    best: tuple[float, list[str], list[tuple[RunningAttempt, str]]] | None = None
    # Who may be evicted depends on the shape, class, 2D-LAS queue and admission of the job; within a
    # cycle, nodes are only held and GPUs only taken, so a job like one that found no victims finds none.
    memo = (eligibility.key(job), job.priority, job.las, admitted, admitted or job.team)
    if memo in eligibility.no_victims:
        return None
    if not eligibility.may_find_victims(job, policy, admitted):
        eligibility.no_victims.add(memo)
        return None
    by_domain = eligibility.running_by_domain()
    guard = policy.quota and admitted != "nominal"
    stopping = eligibility.stopping_by_team() if policy.quota else {}
    members, need = _quota_shortfall(job, state, cohorts, stopping) if admitted is None else (set(), 0)
    for domain, nodes in eligibility.domains(job).items():
        attempts = by_domain.get(domain)
        if not attempts:
            continue
        if any(n.name in held for n in nodes):
            continue
        names = {n.name for n in nodes}
        options: list[tuple[float, RunningAttempt, str]] = []
        for candidate in attempts:
            attempt = candidate.attempt
            if attempt.stopping:
                options.append((-1.0, attempt, "already stopping"))
            elif not (
                (policy.preempt_priority and attempt.priority < job.priority)
                or (candidate.settled and attempt.las > job.las)
                or (candidate.settled and attempt.borrowed and admitted == "nominal")
            ):
                continue  # no rule of _may_evict could apply: a class below, more served or a reclaim
            elif (why := _may_evict(job, attempt, policy, admitted, state)) is not None and (
                why.startswith("priority") or candidate.settled
            ):
                options.append((candidate.unsaved_gpu_s, attempt, why))
        options.sort(key=lambda option: option[0])
        freed: dict[str, int] = {name: len(state.free[name]) for name in names}
        chosen: list[tuple[RunningAttempt, str]] = []
        loss = 0.0
        leaving: dict[str, int] = {}  # GPUs this victim set takes from each team
        given = 0  # of the quota the job is short of
        beaten = False
        for cost, attempt, why in options:
            fits = sum(1 for name in names if freed[name] >= job.gpus_per_node) >= job.nodes
            if fits and given >= need:
                break
            if best is not None and loss + max(cost, 0.0) >= best[0]:
                beaten = True  # costs only grow from here: another domain loses less
                break
            # Reclaims, and a borrowing job's priority victims, must not take a team below its quota,
            # not even several victims together or with its attempts already stopping: it would then
            # be ordered first and evict its way back. (Least-attained-service victims may: the order
            # puts less-served work before within-quota work.) A team making room from its own lower
            # classes swaps GPUs within its quota: no guard.
            kueue_rule = why.startswith("reclaim") or (guard and why.startswith("priority"))
            if kueue_rule and not attempt.stopping and attempt.team != job.team:
                team = attempt.team
                left = state.usage.get(team, 0) - stopping.get(team, 0) - leaving.get(team, 0) - attempt.gpus
                if left < state.quota(team).gpu_quota:
                    continue
                leaving[team] = leaving.get(team, 0) + attempt.gpus
            chosen.append((attempt, why))
            loss += max(cost, 0.0)
            if not attempt.stopping and attempt.team in members:
                given += attempt.gpus
            for piece in attempt.placement.slices:
                if piece.node in freed:
                    freed[piece.node] += len(piece.gpu_indices)
        room = [name for name in names if freed[name] >= job.gpus_per_node]
        if beaten or len(room) < job.nodes or given < need or not chosen:
            continue
        if best is None or loss < best[0]:
            # The gang goes where its victims are: hold those nodes first, then the emptiest.
            touched = {piece.node for attempt, _ in chosen for piece in attempt.placement.slices}
            room.sort(key=lambda name: (name not in touched, -freed[name], name))
            best = (loss, room[: job.nodes], chosen)
    if best is None:
        eligibility.no_victims.add(memo)
        return None
    return best[1], best[2]


def _quota_shortfall(
    job: PendingJob, state: ClusterState, cohorts: Cohorts, stopping: dict[str, int]
) -> tuple[set[str], int]:
    """For a job not admitted: the teams whose GPUs count against the quota it is admitted on (its
    cohort, or its team alone), and how many GPUs they must give back (beyond those already
    stopping) before it fits."""
    quota = state.quota(job.team)
    if quota.cohort is None:
        members, nominal = [job.team], quota.gpu_quota
    else:
        members, nominal = cohorts[quota.cohort].members, cohorts[quota.cohort].nominal
    used = sum(state.usage.get(team, 0) - stopping.get(team, 0) for team in members)
    return set(members), used + job.gpus - nominal


def run_cycle(pending: list[PendingJob], state: ClusterState, now: datetime, policy: Policy) -> CycleResult:
    result = CycleResult()
    eligibility = _Eligibility(state, now)
    held: set[str] = set()  # nodes reserved for a waiting job: nobody else may start there
    preempting = policy.preempt_priority or policy.preempt_las or policy.reclaim
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
    for job in policy.order(pending, state, now):
        if (why := parked.get(job.kind)) is not None:
            result.waiting[job.id] = why
            continue
        admitted: str | None = "nominal"
        if policy.quota:
            asked = (job.team, job.gpus)
            if asked not in admissions:
                admissions[asked] = admit(job, state, cohorts)
            admitted = admissions[asked]
        alike = (job.kind, admitted)
        if alike in failed:
            result.waiting[job.id] = parked[job.kind] = failed[alike]
            if not policy.backfill:
                break
            continue
        placement = place(job, state, eligibility, held) if admitted is not None else None
        if placement is not None:
            state.take(job.team, placement, borrowed=admitted == "borrow")
            if (cohort := state.quota(job.team).cohort) is not None:
                cohorts[cohort].used += placement.gpus
            eligibility.taken(placement)
            admissions.clear()
            parked.clear()  # admissions changed
            result.placed.append(Placed(job, placement, borrowed=admitted == "borrow"))
            continue
        found = None
        if preempting:
            found = _victims(job, state, now, policy, admitted, eligibility, held, cohorts)
        if found is not None:
            nodes, victims = found
            for attempt, why in victims:
                if not attempt.stopping:
                    result.evicted.append(Eviction(attempt, job.id, why))
            eligibility.mark_stopping([v for v, _ in victims])
            held.update(nodes)
            result.reserved_for[job.id] = state.nodes[nodes[0]].domain_key
            result.waiting[job.id] = "waiting for preempted attempts to stop"
            continue
        if admitted is None:
            result.waiting[job.id] = failed[alike] = parked[job.kind] = OVER_QUOTA
            continue
        result.waiting[job.id] = failed[alike] = parked[job.kind] = NO_ROOM
        if policy.reserve_head and not result.reserved_for and job.nodes * job.gpus_per_node > 1:
            domains = eligibility.domains(job)
            if domains:
                domain = max(domains, key=lambda d: (state.free_in(domains[d]), d))
                held |= reservation(job, domains[domain], state)
                result.reserved_for[job.id] = domain
        if not policy.backfill:
            break
    return result
