"""How often a node interrupts the attempts on it, and so how often a gang is interrupted (pure).

Each node keeps a record: the attempt time spent on it and the interruptions charged to it, both
decaying with a half-life of a week, so the record follows a node that got better or worse. An
attempt that ends adds its run time to each of its nodes; a LOST attempt of k nodes charges each
of them 1/k of an interruption (which node failed is not known; a pool of equal nodes is charged
its true rate either way). A node's rate is the posterior mean under a prior of one interruption
per expected MTBI (the fleet's `Node.expected_mtbi_s`): (interruptions + 1) / (run + prior), the
prior alone until a node has history. A gang is interrupted when any of its nodes is: its rate
is the sum of theirs (8 spot nodes, about 8 times as often as one), its MTBI the inverse.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

HALF_LIFE_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class NodeRecord:
    run_s: float
    interruptions: float
    at: datetime

    def at_time(self, now: datetime) -> NodeRecord:
        """The record as it weighs at `now` (never heavier: a clock that went back decays nothing)."""
        weight = 0.5 ** (max(0.0, (now - self.at).total_seconds()) / HALF_LIFE_S)
        return NodeRecord(self.run_s * weight, self.interruptions * weight, max(now, self.at))

    def after(self, ran_s: float, interruptions: float, now: datetime) -> NodeRecord:
        """The record once an attempt that ran `ran_s` here, charged `interruptions`, ended at `now`."""
        decayed = self.at_time(now)
        return NodeRecord(decayed.run_s + max(0.0, ran_s), decayed.interruptions + interruptions, decayed.at)


def ended_attempt(
    records: dict[str, NodeRecord], nodes: Iterable[str], ran_s: float, lost: bool, now: datetime
) -> dict[str, NodeRecord]:
    """Each of the attempt's nodes' records once it ended (`records` holds those that have one)."""
    names = sorted(set(nodes))
    share = 1.0 / len(names) if lost and names else 0.0
    empty = NodeRecord(0.0, 0.0, now)
    return {name: records.get(name, empty).after(ran_s, share, now) for name in names}


def node_rate(record: NodeRecord | None, prior_mtbi_s: float, now: datetime) -> float:
    """Interruptions per second of attempt time on the node."""
    if prior_mtbi_s <= 0:
        raise ValueError(f"prior MTBI must be positive, got {prior_mtbi_s}")
    if record is None:
        return 1.0 / prior_mtbi_s
    seen = record.at_time(now)
    return (seen.interruptions + 1.0) / (seen.run_s + prior_mtbi_s)


def gang_mtbi_s(rates: Iterable[float]) -> float:
    """Mean time between interruptions of an attempt on all these nodes at once."""
    total = math.fsum(rates)
    if total <= 0:
        raise ValueError("a gang needs at least one node with a positive interruption rate")
    return 1.0 / total
