"""Preemption: which running attempts a job that cannot fit may evict, and the victim set it takes.

One table of rules (`RULES`, by name), as Kueue keeps preemption apart from admission
(`pkg/scheduler/preemption`); a policy names the rules it evicts by (`Policy.preemption`), and they
apply in the table's order. Each rule states, besides its full condition, a necessary one as two
ranks: the victim may be taken only if `victim_rank(victim) > job_rank(job, admitted)`. The cheap
tests of a cycle are derived from those ranks alone: the bounds (over every running attempt: can
any rule find a victim at all?) and the prefilter (can any rule apply to this attempt?). A new rule
is written once, in the table.

Every eviction must agree with the policy's queue order: the victim, requeued, is ordered after the
job that took its GPUs, or it would be placed back on them and the two would evict each other for
ever. Fair-share rules spare attempts that ran less than `MIN_RUN_S`; priority rules only go up a
class: no eviction cycle can form (`docs/scheduler.md`, "No eviction cycles").

Pure, like the cycle: it reads the snapshot and returns victims; the cycle marks them stopping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import NamedTuple

from gpuyard.domain.fleet import Node
from gpuyard.scheduler.snapshot import ClusterState, Cohorts, DomainKey, PendingJob, RunningAttempt
from gpuyard.scheduler.starvation import Standing, StarvationGuard


class Victim(NamedTuple):
    attempt: RunningAttempt
    rule: str  # the name of the rule that takes it; "" for an attempt already stopping
    reason: str


Victims = list[Victim]

# An attempt runs at least this long before fair-share rules (reclaim, least attained service) may
# evict it; only a higher priority class may evict it sooner. Without a quantum, a just-placed
# attempt costs nothing to evict, and two rules can evict and re-place each other in one instant.
MIN_RUN_S = 120.0

NEVER = float("-inf")  # the rank of an attempt a rule can never take


def borrowing_without(victim: RunningAttempt, state: ClusterState) -> bool:
    """Would the victim's team still be at or above its nominal quota without this attempt?"""
    return state.usage.get(victim.team, 0) - victim.gpus >= state.quota(victim.team).gpu_quota


class Claim(NamedTuple):
    """A job looking for victims, as the rules read it."""

    job: PendingJob
    admitted: str | None  # 'nominal', 'borrow' or None (over quota and the cohort is full)
    starving: bool  # past its starvation bound (starvation.StarvationGuard)


class Candidate(NamedTuple):  # a tuple: thousands are built per cycle
    """A running attempt, as the rules read it this cycle."""

    attempt: RunningAttempt
    settled: bool  # ran at least MIN_RUN_S
    held: bool  # held by the starvation guard (`starvation.StarvationGuard.held`)
    unsaved_gpu_s: float
    ranks: tuple[float, ...] = ()  # per rule of the policy (`Preemption._ranks`)


@dataclass(frozen=True)
class Rule:
    """When a candidate may make room for a claim: the ranks, then `allows`; the first rule of the
    table that applies gives the reason. `allows` and `keeps_quota` read the policy's terms from the
    search (`Preemption`: its quota admission, whether it evicts by least attained service, its
    guard), not the policy: the policies are built from this table."""

    name: str
    # The eviction's reason, shown to the victim's team: it names the job (`{id}`) only where the rule
    # keeps to one team; another team's job or team it never names (docs/security.md).
    reason: str
    settled: bool  # the victim must have run MIN_RUN_S (fair-share rules); a higher class need not wait
    # Reads only the candidate's class, 2D-LAS queue, borrowed flag and starvation (memoized by them).
    victim_rank: Callable[[Candidate], float]
    job_rank: Callable[[Claim], float]
    allows: Callable[[Claim, Candidate, Preemption, ClusterState], bool]
    # Victims taken by this rule must not together take another team below its nominal quota (with
    # its attempts already stopping): it would then be ordered first and evict its way back.
    keeps_quota: Callable[[Preemption, Claim], bool]
    # It takes back what an elastic job consented to give (its GPUs above its min), from any attempt
    # whatever its preemptible flag, and frees only those GPUs (`RunningAttempt.surplus`).
    resizes: bool = False


def _class(candidate: Candidate) -> float:
    return -candidate.attempt.priority


def _job_class(claim: Claim) -> float:
    return -claim.job.priority


def _never(search: Preemption, claim: Claim) -> bool:
    return False


def _in_order(claim: Claim, candidate: Candidate) -> bool:
    """The starving come first in the order of their class: a job that is not starving may not take
    an attempt the guard holds."""
    return claim.starving or not candidate.held


LAS = "least attained service"

# In order of precedence: the first rule that allows a victim names its eviction.
_TABLE = (
    # Over quota with a full cohort, a team swaps GPUs within its own usage for a higher class (Kueue's
    # withinClusterQueue).
    Rule(
        "priority within team",
        "priority within its team: job {id} outranks it",
        settled=False,
        victim_rank=_class,
        job_rank=_job_class,
        allows=lambda claim, c, s, state: claim.admitted is None and c.attempt.team == claim.job.team,
        keeps_quota=_never,
    ),
    # By class, Kueue's borrowWithinCohort: a job within its quota may take any lower class, a
    # borrowing job (or one waiting for the cohort to have room) only from a team still borrowing
    # without the victim.
    Rule(
        "priority",
        "priority: a job of a higher priority class needs its GPUs",
        settled=False,
        victim_rank=_class,
        job_rank=_job_class,
        allows=lambda claim, c, s, state: (
            not s.quota or claim.admitted == "nominal" or borrowing_without(c.attempt, state)
        ),
        keeps_quota=lambda s, claim: s.quota and claim.admitted != "nominal",
    ),
    # 2D-LAS, of any team and whatever its quota (gpuyard orders attained service before quota), and
    # of no higher class.
    Rule(
        LAS,
        "fair share: a job that has had less GPU time needs its GPUs (least attained service)",
        settled=True,
        victim_rank=lambda c: c.attempt.las,
        job_rank=lambda claim: claim.job.las,
        allows=lambda claim, c, s, state: c.attempt.priority <= claim.job.priority and _in_order(claim, c),
        keeps_quota=_never,
    ),
    # A team under its nominal quota takes borrowed GPUs back, from a team that stays at or above its
    # quota (Kueue reclaims from ClusterQueues that are borrowing); under LAS policies only from work
    # served at least as much, as the order puts less-served work first.
    Rule(
        "reclaim",
        "fair share: its team borrowed these GPUs beyond its quota, and a team under its quota reclaims them",
        settled=True,
        victim_rank=lambda c: 1.0 if c.attempt.borrowed else 0.0,
        job_rank=lambda claim: 0.0 if claim.admitted == "nominal" else 1.0,
        allows=lambda claim, c, s, state: (
            (not s.las or c.attempt.las >= claim.job.las)
            and borrowing_without(c.attempt, state)
            and _in_order(claim, c)
        ),
        keeps_quota=lambda s, claim: True,
    ),
    # A starving job takes GPUs from any settled attempt of no higher class that the guard does not
    # hold, or holds and was submitted later (starving jobs go first, oldest first), whatever its
    # 2D-LAS queue; borrowing, only as priority does (borrowWithinCohort).
    Rule(
        "starvation",
        "starvation: a job that waited past its bound needs its GPUs",
        settled=True,
        victim_rank=lambda c: 0.5 if c.held else 1.0,
        job_rank=lambda claim: 0.0 if claim.starving else 1.0,
        allows=lambda claim, c, s, state: (
            c.attempt.priority <= claim.job.priority
            and (not (c.held or s.younger_only) or c.attempt.age > claim.job.age)
        ),
        keeps_quota=lambda s, claim: s.quota and claim.admitted != "nominal",
    ),
)
RULES: dict[str, Rule] = {rule.name: rule for rule in _TABLE}

# Shrink before preempt (a policy's sizing rule, `scheduler/sizing.py`, turns it on): a job that does
# not fit takes back the GPUs elastic jobs hold above their min, before any rule of the table is
# looked at. Its own search (`Preemption` with this rule alone), never mixed with the table's: an
# elastic job requeued by it comes back at its min at least, so the GPUs taken are only its surplus.
SHRINK = Rule(
    "shrink",
    "resize: an elastic job gives back its GPUs above its minimum to a job that needs them",
    settled=False,
    victim_rank=lambda c: 1.0 if c.attempt.surplus else NEVER,
    job_rank=lambda claim: 0.0,
    allows=lambda claim, c, s, state: True,
    keeps_quota=_never,
    resizes=True,
)


class Preemption:
    """One cycle's victim searches. What they read of each running attempt (its ranks, its unsaved
    progress) is computed once, on the first search; evictions update it (`mark_stopping`). Within a
    cycle nodes are only held and GPUs only taken, so a job like one that found no victims finds none.
    """

    def __init__(
        self,
        state: ClusterState,
        now: datetime,
        rules: tuple[Rule, ...],
        *,
        quota: bool,
        guard: StarvationGuard | None,
        starving: frozenset[str],
        demand: float = 1.0,
        min_run_s: float = MIN_RUN_S,
    ):
        """`rules`, `quota`, `guard` and `min_run_s`: the policy's (`Policy.rules`, `.quota`,
        `.starvation`, `.min_run_s`)."""
        self.state, self.now = state, now
        self.min_run_s = min_run_s
        self.rules = rules  # in the table's order; ranks are per rule of these
        self.quota = quota  # admission by team quota (Kueue semantics)
        self.las = any(rule.name == LAS for rule in rules)  # less-served work is ordered first
        self.guard = guard
        self.younger_only = guard is not None and guard.takes_younger_only  # starving jobs take only them
        self.starving = starving  # ids of the pending jobs past their starvation bound
        self.demand = demand  # the fleet's demand over its GPUs (StarvationGuard.demand), for the guard
        # A job's prefilter answer per rank tuple: attempts share a few rank tuples, so a search
        # costs a lookup per attempt (cleared per search: the floors are the job's).
        self._passes: dict[tuple[float, ...], bool] = {}
        self.no_victims: set[tuple[object, ...]] = set()
        self._by_domain: dict[DomainKey, list[Candidate]] | None = None
        self._best: list[float] = [NEVER] * len(self.rules)  # per rule, the highest rank of any attempt
        self._domain_best: dict[DomainKey, list[float]] = {}  # the same, per domain
        self._domain_stopping: set[DomainKey] = set()  # domains with an attempt already stopping
        self._any_stopping = False
        self._stopping: dict[str, int] = {}  # GPUs per team of attempts already asked to stop

    def _ranks(self, candidate: Candidate) -> tuple[float, ...]:
        """Each rule's rank of the candidate; NEVER where no rule could take it. Rules sharing a rank
        function (the two priority rules) compute it once."""
        ranks = [NEVER] * len(self.rules)
        computed: dict[Callable[[Candidate], float], float] = {}
        for i, rule in enumerate(self.rules):
            if (candidate.attempt.preemptible or rule.resizes) and (candidate.settled or not rule.settled):
                rank = computed.get(rule.victim_rank)
                if rank is None:
                    rank = computed[rule.victim_rank] = rule.victim_rank(candidate)
                ranks[i] = rank
        return tuple(ranks)

    def _held(self, attempt: RunningAttempt, now_s: float, weighted: dict[str, float]) -> bool:
        """Does the starvation guard hold the attempt (at its team's share without it)? `weighted`:
        each team's weighted nominal quota, as `dominant_share` divides by it."""
        guard = self.guard
        if guard is None:
            return False
        share = (self.state.usage.get(attempt.team, 0) - attempt.gpus) / weighted[attempt.team]
        return guard.held(
            Standing(attempt.age[0], attempt.gpus, attempt.attained_gpu_s, share, self.demand), now_s
        )

    def running_by_domain(self) -> dict[DomainKey, list[Candidate]]:
        if self._by_domain is None:
            self._by_domain = {}
            now_s = self.now.timestamp()
            live: list[tuple[float, ...]] = []
            # A victim's ranks read only what `Rule.victim_rank` may read (see Rule): attempts alike in
            # those share one rank tuple, computed once.
            ranked: dict[tuple[object, ...], tuple[float, ...]] = {}
            quotas = {team: self.state.quota(team) for team in {a.team for a in self.state.running}}
            weighted = {team: max(q.gpu_quota, 1) * q.weight for team, q in quotas.items()}
            for attempt in self.state.running:
                p = attempt.placement
                settled = now_s - attempt.started_s >= self.min_run_s
                unsaved = max(0.0, now_s - attempt.saved_s) * attempt.gpus  # = unsaved_gpu_s(now)
                held = self._held(attempt, now_s, weighted)
                alike = (
                    attempt.preemptible,
                    settled,
                    held,
                    attempt.priority,
                    attempt.las,
                    attempt.borrowed,
                    attempt.surplus > 0,
                )
                ranks = ranked.get(alike)
                if ranks is None:
                    ranks = ranked[alike] = self._ranks(Candidate(attempt, settled, held, unsaved))
                domain = (p.site, p.cluster, p.domain)
                self._by_domain.setdefault(domain, []).append(
                    Candidate(attempt, settled, held, unsaved, ranks)
                )
                if attempt.stopping:
                    self._any_stopping = True
                    self._domain_stopping.add(domain)
                    self._stopping[attempt.team] = self._stopping.get(attempt.team, 0) + attempt.gpus
                else:
                    live.append(ranks)
                    best = self._domain_best.get(domain)
                    self._domain_best[domain] = list(ranks) if best is None else list(map(max, best, ranks))
            if live:
                self._best = [max(column) for column in zip(*live, strict=True)]
        return self._by_domain

    def stopping_by_team(self) -> dict[str, int]:
        self.running_by_domain()
        return self._stopping

    def may_find_victims(self, claim: Claim) -> bool:
        """False when no running attempt can be a victim of the claim under any rule: the bounds."""
        self.running_by_domain()
        return self._any_stopping or any(
            best > rule.job_rank(claim) for best, rule in zip(self._best, self.rules, strict=True)
        )

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
                self._domain_stopping.add((p.site, p.cluster, p.domain))
        self._any_stopping = True  # the ranks' bounds stay upper bounds
        self.state.running = [
            replace(a, stopping=True) if a.attempt_id in ids else a for a in self.state.running
        ]

    def victims(
        self,
        job: PendingJob,
        admitted: str | None,
        shape: tuple[object, ...],
        domains: dict[DomainKey, list[Node]],
        held: set[str],
        cohorts: Cohorts,
    ) -> tuple[list[str], Victims] | None:
        """The nodes the gang will use and the victim set that makes room there, losing the least
        unsaved progress, among the job's eligible `domains` (none with a node `held` for another job).

        Attempts already stopping count as free-to-come at no cost, so a job waiting on its victims
        never asks for more. A job over quota whose cohort is full (`admitted` None) also needs its
        victims to give back enough of the cohort's quota to be admitted once they stop.
        """
        state = self.state
        claim = Claim(job, admitted, job.id in self.starving)
        best: tuple[float, list[str], Victims] | None = None
        # Who may be evicted depends on the shape, class, 2D-LAS queue, admission and starvation of
        # the job.
        memo = (shape, job.priority, job.las, admitted, admitted or job.team, claim.starving)
        if memo in self.no_victims:
            return None
        if not self.may_find_victims(claim):
            self.no_victims.add(memo)
            return None
        by_domain = self.running_by_domain()
        floors = [rule.job_rank(claim) for rule in self.rules]
        # The rules that may take some attempt of this cycle from this job (the bounds), in order.
        active = [(i, floors[i], rule) for i, rule in enumerate(self.rules) if self._best[i] > floors[i]]
        passes = self._passes
        passes.clear()
        keeps_quota = [rule.keeps_quota(self, claim) for rule in self.rules]
        stopping = self.stopping_by_team() if self.quota else {}
        members, need = _quota_shortfall(job, state, cohorts, stopping) if admitted is None else (set(), 0)
        for domain, nodes in domains.items():
            attempts = by_domain.get(domain)
            if not attempts:
                continue
            if domain not in self._domain_stopping:
                reach = self._domain_best.get(domain)
                if reach is None or not any(reach[i] > floor for i, floor, _ in active):
                    continue  # the domain's bounds: no attempt there can be taken by any rule
            if any(n.name in held for n in nodes):
                continue
            names = {n.name for n in nodes}
            options: list[tuple[float, Victim, bool]] = []
            for candidate in attempts:
                attempt = candidate.attempt
                if attempt.stopping:
                    options.append((-1.0, Victim(attempt, "", "already stopping"), False))
                    continue
                ranks = candidate.ranks
                ok = passes.get(ranks)
                if ok is None:
                    ok = passes[ranks] = any(ranks[i] > floor for i, floor, _ in active)
                if not ok:
                    continue  # the prefilter: no rule could apply
                # The first rule of the table whose ranks and full condition let the job take it.
                for i, floor, rule in active:
                    if ranks[i] > floor and rule.allows(claim, candidate, self, state):
                        victim = Victim(attempt, rule.name, rule.reason.format(id=job.id))
                        options.append((candidate.unsaved_gpu_s, victim, keeps_quota[i]))
                        break
            # Least unsaved progress first; among equal losses (free checkpoints: every loss is 0) the
            # work the order serves last: the most-served 2D-LAS queue, then the youngest job.
            options.sort(key=_victim_order)
            freed: dict[str, int] = {name: len(state.free[name]) for name in names}
            chosen: Victims = []
            loss = 0.0
            leaving: dict[str, int] = {}  # GPUs this victim set takes from each team
            given = 0  # of the quota the job is short of
            beaten = False
            for cost, victim, floor in options:
                attempt = victim.attempt
                fits = sum(1 for name in names if freed[name] >= job.gpus_per_node) >= job.nodes
                if fits and given >= need:
                    break
                if best is not None and loss + max(cost, 0.0) >= best[0]:
                    beaten = True  # costs only grow from here: another domain loses less
                    break
                # Several victims together, with the team's attempts already stopping, must not take a
                # team below its quota by a rule that keeps it; a team making room from its own lower
                # classes swaps GPUs within its quota.
                if floor and attempt.team != job.team:
                    team = attempt.team
                    held_after = state.usage.get(team, 0) - stopping.get(team, 0) - leaving.get(team, 0)
                    if held_after - attempt.gpus < state.quota(team).gpu_quota:
                        continue
                    leaving[team] = leaving.get(team, 0) + attempt.gpus
                chosen.append(victim)
                loss += max(cost, 0.0)
                shrunk = victim.rule == SHRINK.name
                if not attempt.stopping and attempt.team in members:
                    given += attempt.surplus if shrunk else attempt.gpus
                for piece in attempt.placement.slices:
                    if piece.node in freed:
                        freed[piece.node] += len(piece.gpu_indices) - (attempt.kept_per_node if shrunk else 0)
            room = [name for name in names if freed[name] >= job.gpus_per_node]
            if beaten or len(room) < job.nodes or given < need or not chosen:
                continue
            if best is None or loss < best[0]:
                # The gang goes where its victims are: hold those nodes first, then the emptiest.
                touched = {piece.node for victim in chosen for piece in victim.attempt.placement.slices}
                room.sort(key=lambda name: (name not in touched, -freed[name], name))
                best = (loss, room[: job.nodes], chosen)
        if best is None:
            self.no_victims.add(memo)
            return None
        return best[1], best[2]


def _victim_order(option: tuple[float, Victim, bool]) -> tuple[float, int, float]:
    cost, victim, _ = option
    return cost, -victim.attempt.las, -victim.attempt.age[0]


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
