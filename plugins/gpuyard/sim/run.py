"""One call that replays a trace on a fleet under a named policy, with quotas and a progress bar."""

from __future__ import annotations

import sys

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet
from gpuyard.scheduler.policy import POLICIES, Policy
from gpuyard.sim.engine import Observer, SimConfig, SimResult, Simulator
from gpuyard.sim.fleet_builder import derive_quotas
from gpuyard.sim.trace import TraceJob
from tqdm import tqdm

PROGRESS_FROM_JOBS = 2000  # a bar only on long runs


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None


def simulate(
    trace: list[TraceJob],
    fleet: Fleet,
    policy: str | Policy,
    config: SimConfig | None = None,
    quotas: dict[str, TeamQuota] | None = None,
    quota_rule: str = "share",
    progress: bool = False,
    observer: Observer | None = None,
) -> SimResult:
    chosen = policy_named(policy) if isinstance(policy, str) else policy
    simulator = Simulator(
        fleet=fleet,
        quotas=quotas if quotas is not None else derive_quotas(trace, fleet, quota_rule),
        policy=chosen,
        config=config or SimConfig(),
        observer=observer,
    )
    if not progress or len(trace) < PROGRESS_FROM_JOBS:
        return simulator.run(trace)
    with tqdm(
        total=len(trace), desc=f"sim {chosen.name}", unit="job", file=sys.stderr, mininterval=1.0
    ) as bar:
        simulator.progress = bar.update
        return simulator.run(trace)
