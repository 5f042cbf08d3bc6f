"""Scheduling policies: how the queue is ordered, which plugins and preemption rules a cycle uses,
and which of its mechanisms.

A policy is a profile, as kube-scheduler's (`default_plugins.go`): it names its filters, its scores
with their weights, and its preemption rules, and the names are checked against the registries
(`plugins.FILTERS`, `plugins.SCORES`, `preemption.RULES`) when it is built. A new policy is one
`POLICIES` entry. Every policy runs through the same cycle (cycle.py). None of them reads a job's
true duration: scheduling is non-clairvoyant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from operator import attrgetter

from gpuyard.scheduler.placements import PLACEMENTS, PlacementRule
from gpuyard.scheduler.plugins import FILTERS, SCORES, Filter, Score
from gpuyard.scheduler.preemption import MIN_RUN_S, RULES, Rule
from gpuyard.scheduler.sites import SITE_RULES, SiteRule
from gpuyard.scheduler.sizing import SIZINGS, SizingRule
from gpuyard.scheduler.snapshot import ClusterState, PendingJob
from gpuyard.scheduler.starvation import StarvationGuard

# (queue, snapshot, now, ids of the starving jobs) -> the queue in the order jobs are tried
Order = Callable[[list[PendingJob], ClusterState, datetime, frozenset[str]], list[PendingJob]]


def headroom(jobs: list[PendingJob], state: ClusterState) -> dict[str, int]:
    """GPUs each team of `jobs` may still take within its nominal quota: a job asking more borrows
    from the cohort. Per team, once per order, as queues run to thousands."""
    return {team: state.quota(team).gpu_quota - state.usage.get(team, 0) for team in {j.team for j in jobs}}


def kueue_order(
    jobs: list[PendingJob], state: ClusterState, now: datetime, starving: frozenset[str]
) -> list[PendingJob]:
    """Kueue's: workloads that fit their team's nominal quota before those that must borrow, then
    priority, then age. Without it, a borrower requeued by a reclaim is re-admitted ahead of the
    reclaiming workload on the GPUs it just gave back, and the two evict each other forever."""
    room = headroom(jobs, state)
    return sorted(jobs, key=lambda j: (j.gpus > room[j.team], -j.priority, j.age))


_AGE = attrgetter("age")  # oldest first; in C, as queues run to thousands


def fifo_order(
    jobs: list[PendingJob], state: ClusterState, now: datetime, starving: frozenset[str]
) -> list[PendingJob]:
    return sorted(jobs, key=_AGE)


def las_order(
    jobs: list[PendingJob], state: ClusterState, now: datetime, starving: frozenset[str]
) -> list[PendingJob]:
    return sorted(jobs, key=lambda j: (j.las, j.age))


def gpuyard_order(
    jobs: list[PendingJob], state: ClusterState, now: datetime, starving: frozenset[str]
) -> list[PendingJob]:
    """Priority class; within it starving jobs first (`StarvationGuard`), oldest first; then least
    attained service (2D-LAS queue), then age: first come, first served within a queue, as Tiresias.

    Quota does not order a queue. Within one 2D-LAS queue jobs have had about as much service, so
    none is known to be shorter: ordering them by quota and fair share (as gpuyard did) put every
    job of a team over its quota behind the same queue's work of all other teams whatever it had
    waited, and reclaims swapped equally served runs at two checkpoints and a restore each (on
    Philly 2017-10-22 at 40 nodes: average JCT 1.097 x tiresias, 2,549 reclaims; the worst slowdown
    of a job of more than 8 GPUs 3,017 without the guard, against tiresias' 20). A team's quota acts
    through admission, priority preemption and the guard, whose bound grows with the team's share
    over its quota. Starving jobs are served by age, as Tiresias promotes a starving job to its
    first queue, where the order is first come, first served: otherwise the less-served of them
    would go first again, and a long run starve among them.
    """

    def key(j: PendingJob) -> tuple[object, ...]:
        if j.id in starving:
            return (-j.priority, 0, 0, j.age)
        return (-j.priority, 1, j.las, j.age)

    return sorted(jobs, key=key)


# The plugins a policy uses unless it names others: every filter, and the scores with their weights
# (pack weighs most: best fit keeps whole domains free for gangs).
DEFAULT_FILTERS: tuple[str, ...] = (
    "gpu_type",
    "gpu_memory",
    "host_resources",
    "taints",
    "site",
    "data_access",
)
DEFAULT_SCORES: tuple[tuple[str, float], ...] = (
    ("pack", 3.0),
    ("checkpoint_locality", 2.0),
    ("price", 1.0),
    ("spot_fit", 1.0),
    ("data_locality", 2.0),
)


def _known(policy: str, kind: str, names: tuple[str, ...], registry: Mapping[str, object]) -> None:
    """Every name is in its registry, once: a misspelt plugin fails as the policy is built."""
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ValueError(
            f"policy {policy!r}: unknown {kind} {unknown[0]!r}; expected one of {sorted(registry)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"policy {policy!r}: a {kind} named twice in {list(names)}")


@dataclass(frozen=True)
class Policy:
    """A profile: the queue's order, the plugins and preemption rules it uses by name, and its
    mechanisms (backfill, head reservation, quota admission, a starvation guard). Built, it holds the
    plugins and rules themselves, looked up once."""

    name: str
    order: Order
    # Preemption rules (`preemption.RULES`) it may evict by; none: it never preempts. They apply in
    # the table's order, whatever the order named here.
    preemption: tuple[str, ...] = ()
    filters: tuple[str, ...] = DEFAULT_FILTERS  # `plugins.FILTERS`
    scores: tuple[tuple[str, float], ...] = DEFAULT_SCORES  # `plugins.SCORES`, each with its weight
    backfill: bool = True  # later jobs may start when an earlier one does not fit
    reserve_head: bool = False  # the first gang that does not fit holds nodes so it is not starved
    quota: bool = False  # admit within team quota, borrowing idle cohort quota (Kueue semantics)
    starvation: StarvationGuard | None = None  # promotes jobs that waited past their bound
    placement: str = "best_fit"  # `placements.PLACEMENTS`: the gang's shape and the nodes it takes
    sites: str = "any"  # `sites.SITE_RULES`: at which site a job may start or resume
    sizing: str = "min"  # `sizing.SIZINGS`: what size an elastic job runs at
    # A settled attempt (one fair-share rules may take) ran this long (`preemption.MIN_RUN_S`).
    min_run_s: float = MIN_RUN_S
    filter_plugins: tuple[Filter, ...] = field(init=False, repr=False, compare=False)
    score_plugins: tuple[tuple[float, Score], ...] = field(init=False, repr=False, compare=False)
    rules: tuple[Rule, ...] = field(init=False, repr=False, compare=False)
    placement_rule: PlacementRule = field(init=False, repr=False, compare=False)
    site_rule: SiteRule = field(init=False, repr=False, compare=False)
    sizing_rule: SizingRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _known(self.name, "filter", self.filters, FILTERS)
        _known(self.name, "placement", (self.placement,), PLACEMENTS)
        _known(self.name, "site rule", (self.sites,), SITE_RULES)
        _known(self.name, "sizing rule", (self.sizing,), SIZINGS)
        if self.min_run_s < 0:
            raise ValueError(f"policy {self.name!r}: min_run_s must be >= 0, got {self.min_run_s}")
        _known(self.name, "score", tuple(name for name, _ in self.scores), SCORES)
        _known(self.name, "preemption rule", self.preemption, RULES)
        for name, weight in self.scores:
            if weight <= 0:
                raise ValueError(
                    f"policy {self.name!r}: score {name!r} needs a positive weight, got {weight}"
                )
        if "starvation" in self.preemption and self.starvation is None:
            raise ValueError(
                f"policy {self.name!r}: the preemption rule 'starvation' needs a starvation guard"
            )
        object.__setattr__(self, "filter_plugins", tuple(FILTERS[name] for name in self.filters))
        object.__setattr__(
            self, "score_plugins", tuple((weight, SCORES[name]) for name, weight in self.scores)
        )
        object.__setattr__(
            self, "rules", tuple(rule for rule in RULES.values() if rule.name in self.preemption)
        )
        object.__setattr__(self, "placement_rule", PLACEMENTS[self.placement])
        object.__setattr__(self, "site_rule", SITE_RULES[self.sites])
        object.__setattr__(self, "sizing_rule", SIZINGS[self.sizing])

    @property
    def preempts(self) -> bool:
        """Does it evict at all, that is, name a preemption rule? The cycle and the simulator ask this
        alone: without a rule the cycle never looks for victims, and the simulator keeps no
        snapshots of running attempts."""
        return bool(self.rules)


# gpuyard's guard: a job starves once it has waited 15 times its run so far plus 10 minutes, x its
# team's share over quota, x the fleet's demand over its GPUs (each when above 1), and then takes
# GPUs only from younger jobs: slowdown at most about 15 x demand for jobs of more than 10 minutes,
# plus waits behind older jobs (docs/scheduler.md, "Starvation guard"). The plain bound of 10 lost to
# tiresias where its order was already fine (2017-10-08 at 40 nodes: 1.025). No hysteresis (keep
# 1): holding a let-in job longer cost the contended weeks' short jobs more than it saved.
GPUYARD_STARVATION = StarvationGuard(factor=15.0, floor_s=600.0, overload=True, takes_younger_only=True)

POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy("fifo", fifo_order, backfill=False),
        Policy("fifo-backfill", fifo_order, reserve_head=True),
        Policy("kueue", kueue_order, quota=True, preemption=("priority within team", "priority", "reclaim")),
        Policy("tiresias", las_order, preemption=("least attained service",)),
        Policy(
            "gpuyard",
            gpuyard_order,
            quota=True,
            # No reclaim: under least attained service first it could take only work of the
            # reclaiming job's queue (more-served work is taken by that rule already): equally served
            # work, which first come, first served orders before a younger job (see gpuyard_order).
            preemption=("priority within team", "priority", "least attained service", "starvation"),
            starvation=GPUYARD_STARVATION,
            # No head reservation: the guard bounds a gang's wait; a head reservation also idled GPUs
            # for the first gang that did not fit, however little it had waited (docs/scheduler.md,
            # "Why gpuyard lost").
            # Across sites: its own site first, another once the wait so far beats the checkpoint's
            # copy (scheduler/sites.py; a fleet of one site, or no WAN in the snapshot: any site).
            sites="move",
            # Elastic jobs: shrink before preempt, grow into idle GPUs by marginal goodput.
            sizing="goodput",
        ),
    )
}
# gpuyard whose jobs wait for the site holding their checkpoint (else their home): the baseline of
# the site benchmark (benchmarks/sim_sites.py). Anything but the site rule is gpuyard's.
POLICIES["stay"] = replace(POLICIES["gpuyard"], name="stay", sites="home")
