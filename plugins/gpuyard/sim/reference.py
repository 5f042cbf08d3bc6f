"""The public Tiresias simulator's model (SymbioticLab/Tiresias, `simulator/`), to check the baselines.

Its assumptions: durations fixed; preemption free (no checkpoint, no restore) and taking effect at
once; a cycle at every arrival, completion and 2D-LAS queue jump; switches of 4 nodes x 8 GPUs. Its
placements, as our fleets and placement rules (`scheduler/placements.py`):

- `count` (`cluster.none_placement`: a job starts when the cluster has as many free GPUs, wherever):
  a fleet of 1-GPU nodes in ONE domain, each job a gang of 1-GPU slices (`count_fleet`);
- `yarn` (`switch.ms_yarn_alloc_res`): the switch fleet, first fit in fleet order, jobs of <= 8 GPUs
  on one node, larger ones on `gpus // 8` wholly free nodes plus the remainder, in one switch
  (`placements.first_fit`).

Its schedulers, as our policies run through THE cycle:

- FIFO (`one_queue_fifo_sim_jobs`): strict arrival order, stop at the first job that does not fit:
  our `fifo` (no backfill).
- DLAS-GPU (`dlas_sim_jobs(gputime=True)`): 3 queues split at 3,250 and 7,200 GPU-seconds of attained
  service, first come first served within a queue, any job that fits by count starts (backfill), a
  running job yields to a less-served one at once, and a preempted job keeps its service and queue
  and may start again at the next cycle. It always places by count (its DLAS pass counts free GPUs
  only), whatever its `--scheme`: our `tiresias` on `count_fleet` (`dlas`), with no minimum run
  before a fair-share preemption (`Policy.min_run_s` 0), victims in reverse queue order
  (`preemption._victim_order` on free checkpoints). "First come" is entry into the queue there
  (`QueueEntryOrder`, the variant `dlas_entry`), submission in our `tiresias` (`las_order`).

`VARIANTS` names the runs of `benchmarks/sim_reference.py`; `gpuyard` is our policy under the same
model with its own domain placement on the switches (a `yarn`-like gang placement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from gpuyard.domain.fleet import Fleet
from gpuyard.scheduler.policy import POLICIES, Order, Policy
from gpuyard.scheduler.snapshot import LAS_THRESHOLDS, ClusterState, PendingJob
from gpuyard.sim.engine import SimConfig
from gpuyard.sim.fleet_builder import standard_fleet

GPUS_PER_NODE = 8
NODES_PER_SWITCH = 4

# Free preemption, no spot nodes or interruptions, a cycle at each queue jump.
REFERENCE_CONFIG = SimConfig(
    checkpoint_cost_s=0.0, restore_s=0.0, preemptible_mtbi_s=None, on_demand_mtbi_s=None, las_wakes=True
)


def switch_fleet(nodes: int) -> Fleet:
    """`nodes` x 8 GPUs under switches of 4 nodes (a domain per switch), none spot."""
    return standard_fleet(nodes, GPUS_PER_NODE, NODES_PER_SWITCH, preemptible_nodes=0)


def count_fleet(nodes: int) -> Fleet:
    """The same GPUs as 1-GPU nodes in one domain: placement by count, topology ignored."""
    gpus = nodes * GPUS_PER_NODE
    return standard_fleet(gpus, 1, gpus, preemptible_nodes=0)


class QueueEntryOrder:
    """The public simulator's order of a 2D-LAS queue (`dlas_sim_jobs`), as an `Order` of our cycle.

    A job joins the tail of a queue when it enters it: Q0 when it arrives, the next queue when its
    attained service crosses a threshold (jobs that enter at one instant in submission order). After
    each pass the jobs that run move ahead of those that wait, each group keeping its order; so a
    preempted job waits ahead of the jobs that were already waiting in its queue. The queue is first
    come, first served by entry; `las_order` serves it by submission.

    Not modelled: at the pass where a running job enters a queue, the public simulator puts it behind
    that queue's waiting jobs, which may take its GPUs; our least-attained-service rule takes only
    work of a more-served queue (docs/simulator.md).

    One per replay (`Variant.build` makes it): it keeps the queues between cycles. It reads the
    cycle's running attempts, which the simulator gives only to a policy that preempts, and their
    attained service, current at every cycle when checkpoints are free (the reference model: the
    simulator then rebuilds every snapshot at each cycle).
    """

    def __init__(self) -> None:
        self.queues: list[list[str]] = [[] for _ in range(len(LAS_THRESHOLDS) + 1)]
        self.queue_of: dict[str, int] = {}

    def __call__(
        self, jobs: list[PendingJob], state: ClusterState, now: datetime, starving: frozenset[str]
    ) -> list[PendingJob]:
        runs = {a.job_id for a in state.running if not a.stopping}
        now_s = now.timestamp()
        # Each job of the cycle: its 2D-LAS queue and when it entered it (its submission for Q0; for
        # a running attempt, the instant its attained service crossed the threshold, which a cycle
        # need not have seen: the simulator runs none while no job waits), then its age.
        seen: dict[str, tuple[int, float, tuple[float, str]]] = {}
        for a in state.running:
            entered = a.age[0]
            if a.las:
                entered = now_s - (a.attained_gpu_s - LAS_THRESHOLDS[a.las - 1]) / max(a.gpus, 1)
            seen[a.job_id] = (a.las, entered, a.age)
        for j in jobs:
            seen[j.id] = (j.las, j.age[0], j.age)
        # The last pass's outcome: who runs goes ahead of who waits; finished jobs leave.
        for q, queue in enumerate(self.queues):
            kept = [job for job in queue if job in seen]
            self.queues[q] = [job for job in kept if job in runs] + [job for job in kept if job not in runs]
        # Arrivals and demotions since: to the tail of their queue, in the order they entered it.
        moved = sorted(
            (entered, age, job, las)
            for job, (las, entered, age) in seen.items()
            if self.queue_of.get(job) != las
        )
        for _, _, job, las in moved:
            old = self.queue_of.get(job)
            if old is not None:
                self.queues[old].remove(job)
            self.queue_of[job] = las
            self.queues[las].append(job)
        for job in set(self.queue_of) - seen.keys():
            del self.queue_of[job]
        place = {job: i for queue in self.queues for i, job in enumerate(queue)}
        return sorted(jobs, key=lambda j: (j.las, place[j.id]))


@dataclass(frozen=True)
class Variant:
    """One run of the reference model: a policy of ours, the placement rule it uses, its fleet."""

    name: str
    policy: str  # `policy.POLICIES`
    placement: str  # `placements.PLACEMENTS`
    fleet: Callable[[int], Fleet]
    min_run_s: float | None = None  # None: the policy's own
    order: Callable[[], Order] | None = None  # makes the queue's order for one replay; None: the policy's
    about: str = ""

    def build(self) -> Policy:
        """The policy for ONE replay (an order that keeps state is made anew)."""
        base = POLICIES[self.policy]
        return replace(
            base,
            name=self.name,
            order=base.order if self.order is None else self.order(),
            placement=self.placement,
            min_run_s=base.min_run_s if self.min_run_s is None else self.min_run_s,
        )


VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in (
        Variant("fifo_count", "fifo", "first_fit", count_fleet, about="FIFO, placement by count"),
        Variant("fifo_yarn", "fifo", "first_fit", switch_fleet, about="FIFO, YARN's placement"),
        Variant("dlas", "tiresias", "first_fit", count_fleet, min_run_s=0.0, about="our tiresias, by count"),
        Variant("gpuyard", "gpuyard", "best_fit", switch_fleet, about="our gpuyard on the switches"),
        # Not in the RESULT line unless asked for (--variants): what explains the differences.
        Variant(
            "dlas_entry",
            "tiresias",
            "first_fit",
            count_fleet,
            min_run_s=0.0,
            order=QueueEntryOrder,
            about="dlas with the public order within a queue (QueueEntryOrder)",
        ),
        Variant(
            "gpuyard_run0",
            "gpuyard",
            "best_fit",
            switch_fleet,
            min_run_s=0.0,
            about="gpuyard on the switches without its 120 s minimum run",
        ),
        Variant(
            "gpuyard_count_run0",
            "gpuyard",
            "first_fit",
            count_fleet,
            min_run_s=0.0,
            about="gpuyard by count without its minimum run: dlas plus quota admission and the guard",
        ),
    )
}
# The RESULT line's variants (issue 37): A, B, C and G.
DEFAULT_VARIANTS = ("fifo_count", "fifo_yarn", "dlas", "gpuyard")
