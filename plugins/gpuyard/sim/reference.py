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
  only), whatever its `--scheme`: our `tiresias` on `count_fleet`, with no minimum run before a
  fair-share preemption (`Policy.min_run_s` 0), victims in reverse queue order
  (`preemption._victim_order` on free checkpoints).

`VARIANTS` names the runs of `benchmarks/sim_reference.py`; `gpuyard` is our policy under the same
model with its own domain placement on the switches (a `yarn`-like gang placement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuyard.domain.fleet import Fleet
from gpuyard.scheduler.policy import POLICIES, Policy
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


@dataclass(frozen=True)
class Variant:
    """One run of the reference model: a policy of ours, the placement rule it uses, its fleet."""

    name: str
    policy: str  # `policy.POLICIES`
    placement: str  # `placements.PLACEMENTS`
    fleet: Callable[[int], Fleet]
    min_run_s: float | None = None  # None: the policy's own

    def build(self) -> Policy:
        base = POLICIES[self.policy]
        return replace(
            base,
            name=self.name,
            placement=self.placement,
            min_run_s=base.min_run_s if self.min_run_s is None else self.min_run_s,
        )


VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in (
        Variant("fifo_count", "fifo", "first_fit", count_fleet),
        Variant("fifo_yarn", "fifo", "first_fit", switch_fleet),
        Variant("dlas", "tiresias", "first_fit", count_fleet, min_run_s=0.0),
        Variant("gpuyard", "gpuyard", "best_fit", switch_fleet),
    )
}
