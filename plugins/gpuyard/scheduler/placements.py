"""Placement rules, by name (`PLACEMENTS`): how a gang is shaped into per-node slices and which nodes
of which domain it takes. A policy names its rule (`policy.Policy.placement`); a new rule is one entry.

- `best_fit`, gpuyard's: even slices (`ceil(gpus / nodes)` per node, the gang rounded up to whole
  slices), the domain and nodes chosen by the policy's scores, best fit first (`cycle.place`).
- `first_fit`, the Microsoft YARN rule of the public Tiresias simulator (SymbioticLab/Tiresias,
  `simulator/switch.py`): a job of at most a node's GPUs on the first node (fleet order) with room; a
  larger one on `gpus // node_gpus` wholly free nodes plus one node with the remainder, all in the
  first domain (switch) where they are found; never rounded up. On a fleet of 1-GPU nodes in one
  domain it is that simulator's `count` rule: any free GPUs anywhere (`sim/reference.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpuyard.domain.fleet import Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.snapshot import ClusterState, DomainKey, PendingJob

# (GPUs asked, GPUs of the largest node) -> (nodes, GPUs leased)
Shape = Callable[[int, int], tuple[int, int]]
# (job, snapshot, the job's eligible nodes per domain, nodes held for other jobs) -> a placement or None
Choose = Callable[[PendingJob, ClusterState, dict[DomainKey, list[Node]], set[str]], Placement | None]


def even_shape(gpus: int, node_gpus: int) -> tuple[int, int]:
    """Up to a node's GPUs on one node, else the fewest whole nodes with even slices (rounded up)."""
    if node_gpus <= 0:
        return 1, gpus
    nodes = max(1, math.ceil(gpus / node_gpus))
    return nodes, nodes * math.ceil(gpus / nodes)


def yarn_shape(gpus: int, node_gpus: int) -> tuple[int, int]:
    """YARN's: `gpus // node_gpus` whole nodes and one node with the remainder; exactly `gpus`."""
    if node_gpus <= 0:
        return 1, gpus
    return max(1, math.ceil(gpus / node_gpus)), gpus


def yarn_slices(gpus: int, node_gpus: int) -> list[int]:
    """GPUs per node of a YARN gang: whole nodes first, the remainder last (12 of 8 -> [8, 4])."""
    if gpus <= node_gpus:
        return [gpus]
    whole, rest = divmod(gpus, node_gpus)
    return [node_gpus] * whole + ([rest] if rest else [])


def first_fit(
    job: PendingJob, state: ClusterState, domains: dict[DomainKey, list[Node]], held: set[str]
) -> Placement | None:
    """The first domain in fleet order whose nodes, in order, hold the YARN slices (`yarn_slices`):
    whole slices only on wholly free nodes, the remainder on the first other node with room."""
    for nodes in domains.values():
        open_nodes = [n for n in nodes if n.name not in held]
        if not open_nodes:
            continue
        node_gpus = open_nodes[0].gpus
        sizes = yarn_slices(job.gpus, node_gpus)
        whole = sum(1 for size in sizes if size == node_gpus) if len(sizes) > 1 else 0
        chosen = [n for n in open_nodes if len(state.free[n.name]) == n.gpus][:whole]
        if len(chosen) < whole:
            continue
        slices = [(n, node_gpus) for n in chosen]
        rest = sizes[whole:]
        if rest:
            taken = {n.name for n in chosen}
            last = next(
                (n for n in open_nodes if n.name not in taken and len(state.free[n.name]) >= rest[0]), None
            )
            if last is None:
                continue
            slices.append((last, rest[0]))
        first = slices[0][0]
        return Placement(
            site=first.site,
            cluster=first.cluster,
            domain=first.domain,
            slices=tuple(NodeSlice(n.name, tuple(sorted(state.free[n.name])[:size])) for n, size in slices),
        )
    return None


@dataclass(frozen=True)
class PlacementRule:
    name: str
    shape: Shape
    # None: the cycle's scored search (best fit by the policy's scores, `cycle.place`)
    choose: Choose | None


PLACEMENTS: dict[str, PlacementRule] = {
    rule.name: rule
    for rule in (
        PlacementRule("best_fit", even_shape, None),
        PlacementRule("first_fit", yarn_shape, first_fit),
    )
}
