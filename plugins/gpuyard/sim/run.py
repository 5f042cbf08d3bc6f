"""One call that replays a trace on a fleet under a named policy, with quotas and a progress bar."""

from __future__ import annotations

import sys

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet
from gpuyard.scheduler.policy import POLICIES, Policy
from gpuyard.sim.engine import Observer, SimConfig, SimResult, Simulator
from gpuyard.sim.fleet_builder import derive_quotas
from gpuyard.sim.oracle import ORACLE_SJF, oracle_sjf
from gpuyard.sim.trace import TraceJob
from tqdm import tqdm

PROGRESS_FROM_JOBS = 2000  # a bar only on long runs


# The simulator also offers a clairvoyant reference; the service never does (see oracle.py).
POLICY_NAMES = (*POLICIES, ORACLE_SJF)


def check_policy(name: str) -> str:
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICY_NAMES)}")
    return name


def policy_named(name: str, trace: list[TraceJob] | None = None) -> Policy:
    """A policy of the service by name, or `oracle-sjf` built from the trace's true durations."""
    if check_policy(name) == ORACLE_SJF:
        return oracle_sjf({job.id: job.duration_s for job in trace or []})
    return POLICIES[name]


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
    chosen = policy_named(policy, trace) if isinstance(policy, str) else policy
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
