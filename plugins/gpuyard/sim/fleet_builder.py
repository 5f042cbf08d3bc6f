"""Build the fleets and team quotas the simulator replays traces on.

The standard fleet of the benchmarks: N nodes x 8 GPUs, fast domains of 4 nodes, the last quarter of
the nodes preemptible (spot, tainted, cheaper) and grouped into whole domains, as spot pools are.
Quotas are derived from the fleet and the trace by a documented rule (see `derive_quotas`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import yaml
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.scheduler.plugins import SPOT_TAINT
from gpuyard.sim.trace import TraceJob

COHORT = "trace"
ON_DEMAND_PRICE = 3.0  # USD per GPU-hour, about a V100 on demand
SPOT_PRICE = 1.0


def standard_fleet(
    nodes: int = 64,
    gpus_per_node: int = 8,
    nodes_per_domain: int = 4,
    preemptible_nodes: int | None = None,
    gpu_type: str = "V100",
    gpu_memory_gb: float = 32.0,
) -> Fleet:
    """`nodes` nodes in domains of `nodes_per_domain`; `preemptible_nodes` (default a quarter) are spot."""
    if nodes < 1 or gpus_per_node < 1 or nodes_per_domain < 1:
        raise ValueError(
            f"a fleet needs >= 1 node, GPU and node per domain, got {nodes}, {gpus_per_node}, "
            f"{nodes_per_domain}"
        )
    spot = nodes // 4 if preemptible_nodes is None else preemptible_nodes
    if not 0 <= spot <= nodes:
        raise ValueError(f"preemptible_nodes must be within 0..{nodes}, got {spot}")
    built = []
    for i in range(nodes):
        preemptible = i >= nodes - spot
        built.append(
            Node(
                name=f"n{i:04d}",
                site="sim",
                cluster="sim",
                domain=f"d{i // nodes_per_domain:03d}",
                gpu_type=gpu_type,
                gpus=gpus_per_node,
                gpu_memory_gb=gpu_memory_gb,
                cpu=64,
                memory_gb=512,
                taints=(SPOT_TAINT,) if preemptible else (),
                price_per_gpu_hour=SPOT_PRICE if preemptible else ON_DEMAND_PRICE,
                preemptible=preemptible,
            )
        )
    return Fleet(nodes=tuple(built))


def write_fleet(fleet: Fleet, path: Path) -> None:
    """The YAML that `gpuyard.domain.fleet.load_fleet` reads back: `{nodes: [...]}`."""
    path.write_text(yaml.safe_dump(fleet.model_dump(mode="json"), sort_keys=False))


def _largest_remainder(weights: dict[str, float], total: int) -> dict[str, int]:
    mass = sum(weights.values())
    if mass <= 0:
        return dict.fromkeys(weights, total // max(len(weights), 1))
    exact = {k: total * w / mass for k, w in weights.items()}
    floor = {k: int(v) for k, v in exact.items()}
    left = total - sum(floor.values())
    for k in sorted(exact, key=lambda k: (floor[k] - exact[k], k))[:left]:
        floor[k] += 1
    return floor


def derive_quotas(jobs: Iterable[TraceJob], fleet: Fleet, rule: str = "share") -> dict[str, TeamQuota]:
    """Nominal GPU quotas that add up to the fleet's GPUs, all teams in ONE cohort (idle quota is lent).

    `share`: each team's quota is proportional to its GPU-time (duration x GPUs) in the replayed trace,
    by largest remainder, at least 1 GPU each: the capacity a Philly virtual cluster was sized for.
    `equal`: the same quota for every team. Weights are 1: fair share is relative to the quota.
    """
    demand: dict[str, float] = defaultdict(float)
    largest_gang = 0
    for job in jobs:
        demand[job.team] += job.duration_s * job.gpus
        largest_gang = max(largest_gang, job.gpus)
    if not demand:
        return {}
    total = sum(n.gpus for n in fleet.nodes)
    if rule == "equal":
        weights = dict.fromkeys(demand, 1.0)
    elif rule == "share":
        weights = dict(demand)
    else:
        raise ValueError(f"quota rule must be 'share' or 'equal', got {rule!r}")
    shares = _largest_remainder(weights, max(total - len(demand), 0))
    return {
        team: TeamQuota(
            gpu_quota=shares[team] + 1,
            cohort=COHORT,
            weight=1.0,
            max_gpus_per_job=max(largest_gang, 1),
        )
        for team in sorted(demand)
    }
