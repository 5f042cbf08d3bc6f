"""One scheduling cycle: order the queue, admit, filter -> score -> reserve, preempt when needed.

Pure: it reads a snapshot and returns decisions, mutating only the snapshot's free GPUs and usage
as it reserves. The service turns the decisions into transactions and launches; the simulator
applies them to its virtual cluster. Both run this same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuyard.domain.fleet import Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.plugins import SCORES, STATIC_FILTERS, free_gpus
from gpuyard.scheduler.policy import Policy, las_queue
from gpuyard.scheduler.snapshot import ClusterState, PendingJob, RunningAttempt

DomainKey = tuple[str, str, str]

# Like kube-scheduler's percentageOfNodesToScore: stop looking once this many feasible domains
# were found, so a cycle over thousands of nodes stays fast. Domains are visited best-fit first.
CANDIDATE_DOMAINS = 32


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
    waiting: dict[str, str] = field(default_factory=dict)  # job id -> why it did not start


def admit(job: PendingJob, state: ClusterState) -> str | None:
    """'nominal' within the team's quota, 'borrow' on idle quota of its cohort, else None."""
    quota = state.quota(job.team)
    if state.usage.get(job.team, 0) + job.gpus <= quota.gpu_quota:
        return "nominal"
    if quota.cohort is None:
        return None
    members = [team for team, q in state.quotas.items() if q.cohort == quota.cohort]
    nominal = sum(state.quotas[team].gpu_quota for team in members)
    used = sum(state.usage.get(team, 0) for team in members)
    return "borrow" if used + job.gpus <= nominal else None


class _Eligibility:
    """Static filter results per job shape, computed once per cycle: domain -> eligible nodes."""

    def __init__(self, state: ClusterState):
        self.state = state
        self._cache: dict[tuple[object, ...], dict[DomainKey, list[Node]]] = {}

    def domains(self, job: PendingJob) -> dict[DomainKey, list[Node]]:
        key = (
            job.team,
            job.gpu_types,
            job.gpu_memory_gb,
            job.sites,
            job.tolerations,
            job.data_uris,
            job.preemptible,
            job.gpus_per_node,
            job.nodes,
        )
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
    ordered = sorted(domains.values(), key=lambda nodes: state.free_in(nodes))
    candidates: list[list[Node]] = []
    for nodes in ordered:
        if state.free_in(nodes) < job.gpus:
            continue
        chosen = _choose_nodes(job, nodes, state, held)
        if chosen:
            candidates.append(chosen)
            if len(candidates) >= CANDIDATE_DOMAINS:
                break
    if not candidates:
        return None
    # Ties go to the earliest candidate, which is the best fit.
    _, best = max(enumerate(candidates), key=lambda item: (_score(job, item[1], state), -item[0]))
    return _placement(job, best, state)


def _may_evict(job: PendingJob, victim: RunningAttempt, policy: Policy, admitted: str | None) -> str | None:
    """Why `victim` may make room for `job`, or None."""
    if not victim.preemptible:
        return None
    if policy.preempt_priority and victim.priority < job.priority:
        return f"priority: {job.id} outranks it"
    if policy.reclaim and admitted == "nominal" and victim.borrowed:
        return f"reclaim: team {job.team} needs its quota back"
    if (
        policy.preempt_las
        and victim.priority <= job.priority
        and las_queue(victim.attained_gpu_s) > las_queue(job.attained_gpu_s)
    ):
        return f"least attained service: {job.id} has had less"
    return None


def _victims(
    job: PendingJob,
    state: ClusterState,
    now: datetime,
    policy: Policy,
    admitted: str | None,
    eligibility: _Eligibility,
    held: set[str],
) -> tuple[DomainKey, list[tuple[RunningAttempt, str]]] | None:
    """The domain and victim set that make room for the gang losing the least unsaved progress.

    Attempts already stopping count as free-to-come at no cost, so a job waiting on its victims
    never asks for more.
    """
    best: tuple[float, DomainKey, list[tuple[RunningAttempt, str]]] | None = None
    by_domain: dict[DomainKey, list[RunningAttempt]] = {}
    for attempt in state.running:
        p = attempt.placement
        by_domain.setdefault((p.site, p.cluster, p.domain), []).append(attempt)
    for domain, nodes in eligibility.domains(job).items():
        if any(n.name in held for n in nodes):
            continue
        names = {n.name for n in nodes}
        options: list[tuple[float, RunningAttempt, str]] = []
        for attempt in by_domain.get(domain, []):
            if attempt.stopping:
                options.append((-1.0, attempt, "already stopping"))
            elif (why := _may_evict(job, attempt, policy, admitted)) is not None:
                options.append((attempt.unsaved_gpu_s(now), attempt, why))
        options.sort(key=lambda option: option[0])
        freed: dict[str, int] = {name: len(state.free[name]) for name in names}
        chosen: list[tuple[RunningAttempt, str]] = []
        loss = 0.0
        for cost, attempt, why in options:
            fits = sum(1 for name in names if freed[name] >= job.gpus_per_node) >= job.nodes
            if fits:
                break
            chosen.append((attempt, why))
            loss += max(cost, 0.0)
            for piece in attempt.placement.slices:
                if piece.node in freed:
                    freed[piece.node] += len(piece.gpu_indices)
        if sum(1 for name in names if freed[name] >= job.gpus_per_node) < job.nodes or not chosen:
            continue
        if best is None or loss < best[0]:
            best = (loss, domain, chosen)
    return None if best is None else (best[1], best[2])


def run_cycle(pending: list[PendingJob], state: ClusterState, now: datetime, policy: Policy) -> CycleResult:
    result = CycleResult()
    eligibility = _Eligibility(state)
    held: set[str] = set()  # nodes reserved for a waiting job: nobody else may start there
    preempting = policy.preempt_priority or policy.preempt_las or policy.reclaim
    for job in policy.order(pending, state, now):
        admitted = admit(job, state) if policy.quota else "nominal"
        if admitted is None:
            result.waiting[job.id] = "over quota, and the cohort has no idle quota to lend"
            continue
        placement = place(job, state, eligibility, held)
        if placement is not None:
            state.take(job.team, placement, borrowed=admitted == "borrow")
            result.placed.append(Placed(job, placement, borrowed=admitted == "borrow"))
            continue
        found = _victims(job, state, now, policy, admitted, eligibility, held) if preempting else None
        if found is not None:
            domain, victims = found
            for attempt, why in victims:
                if not attempt.stopping:
                    result.evicted.append(Eviction(attempt, job.id, why))
            state.running = [
                a if all(a is not v for v, _ in victims) else replace(a, stopping=True) for a in state.running
            ]
            held |= {n.name for n in state.domains[domain]}
            result.reserved_for[job.id] = domain
            result.waiting[job.id] = "waiting for preempted attempts to stop"
            continue
        result.waiting[job.id] = "no domain has room for the whole gang now"
        if policy.reserve_head and not result.reserved_for and job.nodes * job.gpus_per_node > 1:
            domains = eligibility.domains(job)
            if domains:
                domain = max(domains, key=lambda d: (state.free_in(domains[d]), d))
                held |= {n.name for n in state.domains[domain]}
                result.reserved_for[job.id] = domain
        if not policy.backfill:
            break
    return result
