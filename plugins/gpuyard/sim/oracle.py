"""`oracle-sjf`: shortest job first by TRUE duration, a clairvoyant reference for the simulator only.

It reads what no real policy may: how long each job will run. It exists to show how far the
non-clairvoyant policies are from a scheduler that knows the future, as a bound on what duration
estimates could buy. It is not in `gpuyard.scheduler.policy.POLICIES`, so the service can never run
it, and the benchmark never uses it in its RESULT ratios. Non-preemptive, with backfill, no quotas:
it runs through the same cycle as every other policy, only its queue order differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuyard.scheduler.policy import Policy
from gpuyard.scheduler.snapshot import ClusterState, PendingJob

ORACLE_SJF = "oracle-sjf"


def oracle_sjf(durations_s: Mapping[str, float]) -> Policy:
    """The policy for one trace: `durations_s` maps each job id to its true run time."""

    def order(
        jobs: list[PendingJob], state: ClusterState, now: datetime, starving: frozenset[str]
    ) -> list[PendingJob]:
        return sorted(jobs, key=lambda j: (durations_s[j.id], j.age))

    return Policy(ORACLE_SJF, order)  # backfill, no quotas, no preemption rules
