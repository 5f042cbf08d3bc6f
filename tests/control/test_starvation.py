"""The starvation guard (scheduler/starvation.StarvationGuard): its bound, the order it gives, and the
preemption rule that lets a starving job in (scheduler/preemption.RULES)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.cycle import run_cycle
from gpuyard.scheduler.policy import POLICIES, gpuyard_order
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob, RunningAttempt
from gpuyard.scheduler.starvation import Standing, StarvationGuard

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
GUARD = StarvationGuard(factor=4.0, floor_s=600.0)
GPUYARD = replace(POLICIES["gpuyard"], starvation=GUARD)
FLEET = Fleet(
    nodes=(Node(name="n0", site="east", cluster="c", domain="d0", gpu_type="a100", gpus=8, gpu_memory_gb=80),)
)


def pending(
    name: str, gpus: int, *, waited_s: float, attained_gpu_s: float = 0.0, priority: int = 0
) -> PendingJob:
    return PendingJob(
        id=name,
        team="a",
        gpus=gpus,
        nodes=1,
        gpu_types=(),
        priority=priority,
        preemptible=True,
        submitted_at=NOW - timedelta(seconds=waited_s),
        attained_gpu_s=attained_gpu_s,
    )


def running(name: str, gpus: int, *, submitted_s_ago: float, ran_s: float) -> RunningAttempt:
    return RunningAttempt(
        attempt_id=name,
        job_id=name,
        team="a",
        priority=0,
        preemptible=True,
        placement=Placement("east", "c", "d0", (NodeSlice("n0", tuple(range(gpus))),)),
        started_at=NOW - timedelta(seconds=ran_s),
        last_checkpoint_at=None,
        attained_gpu_s=gpus * ran_s,
        submitted_at=NOW - timedelta(seconds=submitted_s_ago),
    )


def state_with(*attempts: RunningAttempt, quota: int = 8) -> ClusterState:
    state = ClusterState.empty(FleetIndex(FLEET), {"a": TeamQuota(gpu_quota=quota)})
    for attempt in attempts:
        state.take(attempt.team, attempt.placement, borrowed=False)
        state.running.append(attempt)
    return state


def test_the_bound_grows_with_the_time_run_and_the_teams_share_over_its_quota() -> None:
    # factor x (run so far + floor) x max(1, the team's weighted share)
    assert GUARD.bound_s(Standing(0.0, 8, 8 * 1000.0, 0.5)) == pytest.approx(6400.0)
    assert GUARD.bound_s(Standing(0.0, 8, 8 * 1000.0, 2.0)) == pytest.approx(12800.0)
    assert GUARD.bound_s(Standing(0.0, 1, 0.0, 0.0)) == pytest.approx(2400.0)  # the floor
    assert not GUARD.starving(Standing(0.0, 8, 8 * 1000.0, 0.5), now_s=6400.0)
    assert GUARD.starving(Standing(0.0, 8, 8 * 1000.0, 0.5), now_s=6400.5)
    # Once it runs, its bound grows 4 times faster than its wait: 600 s past it, held for 200 s.
    assert GUARD.overdue_s(Standing(0.0, 8, 8 * 1000.0, 0.5), now_s=7000.0) == pytest.approx(600.0)
    assert GUARD.held(Standing(0.0, 8, 8 * 1000.0, 0.5), now_s=7000.0)
    assert GUARD.held_for_s(Standing(0.0, 8, 8 * 1000.0, 0.5), now_s=7000.0) == pytest.approx(200.0)
    assert not GUARD.starving(Standing(0.0, 8, 8 * 1200.0, 0.5), now_s=7200.0)
    assert not GUARD.held(Standing(0.0, 8, 8 * 1200.0, 0.5), now_s=7200.0)
    assert GUARD.held_for_s(Standing(0.0, 8, 8 * 1200.0, 0.5), now_s=7200.0) == 0.0
    # Hysteresis: with keep 1/2 a job let in at its bound (6,400 s) stays held until half its bound
    # is back above its wait: 4 x (r + 600) / 2 = 6,400 + (r - 1,000), at r = 4,200 s, 3,200 s on.
    sticky = StarvationGuard(factor=4.0, floor_s=600.0, keep=0.5)
    assert sticky.held_for_s(Standing(0.0, 8, 8 * 1000.0, 0.5), now_s=6400.0) == pytest.approx(3200.0)
    assert sticky.held(Standing(0.0, 8, 8 * 4199.0, 0.5), now_s=9599.0)
    assert not sticky.held(Standing(0.0, 8, 8 * 4201.0, 0.5), now_s=9601.0)
    with pytest.raises(ValueError, match="factor"):
        StarvationGuard(factor=1.0, floor_s=600.0)
    with pytest.raises(ValueError, match="floor_s"):
        StarvationGuard(factor=4.0, floor_s=0.0)
    with pytest.raises(ValueError, match="keep"):
        StarvationGuard(factor=4.0, floor_s=600.0, keep=0.25)  # held for ever: 1 x 4 x 1/4 = 1


def test_a_starving_job_is_ordered_first_of_its_class_and_no_higher() -> None:
    state = state_with()
    served = pending("served", 8, waited_s=20_000.0, attained_gpu_s=8 * 2000.0)  # > 4 x (2,000 + 600)
    fresh = pending("fresh", 1, waited_s=10.0)
    high = pending("high", 1, waited_s=10.0, priority=1)
    starving = GUARD.starving_jobs([served, fresh, high], state, NOW)
    assert starving == {"served"}
    order = gpuyard_order([fresh, served, high], state, NOW, starving)
    assert [j.id for j in order] == ["high", "served", "fresh"]
    # Without the guard, least attained service first.
    assert [j.id for j in gpuyard_order([fresh, served, high], state, NOW, frozenset())] == [
        "high",
        "fresh",
        "served",
    ]


def test_a_starving_job_takes_gpus_of_less_served_work_that_would_not_starve() -> None:
    served = pending("served", 8, waited_s=20_000.0, attained_gpu_s=8 * 2000.0)
    short = running("short", 8, submitted_s_ago=300.0, ran_s=200.0)  # less served: LAS would keep it
    result = run_cycle([served], state_with(short), NOW, GPUYARD)
    (eviction,) = result.evicted
    assert eviction.attempt.attempt_id == "short" and eviction.rule == "starvation"
    # The same job before its bound takes nothing: least attained service protects the short run.
    patient = replace(served, submitted_at=NOW - timedelta(seconds=10_000.0))  # its bound: 10,400 s
    assert run_cycle([patient], state_with(short), NOW, GPUYARD).evicted == []
    assert run_cycle([served], state_with(short), NOW, POLICIES["tiresias"]).evicted == []
    # An attempt that would be starving itself once requeued is not taken, by it or by a less-served job.
    old = running("old", 8, submitted_s_ago=50_000.0, ran_s=1000.0)
    assert run_cycle([served], state_with(old), NOW, GPUYARD).evicted == []
    # ... unless it is older still: starving jobs are served oldest first.
    oldest = replace(served, submitted_at=NOW - timedelta(seconds=60_000.0))
    assert [e.rule for e in run_cycle([oldest], state_with(old), NOW, GPUYARD).evicted] == ["starvation"]
    newcomer = pending("newcomer", 1, waited_s=10.0)
    assert run_cycle([newcomer], state_with(old), NOW, GPUYARD).evicted == []
    assert [e.rule for e in run_cycle([newcomer], state_with(old), NOW, POLICIES["tiresias"]).evicted] == [
        "least attained service"
    ]


def test_a_job_let_in_at_its_bound_is_held_against_less_served_work_until_its_keep() -> None:
    # Let in at its bound (4 x (1,000 + 600) = 6,400 s) and run 300 s since: no longer starving, so
    # without hysteresis (keep 1) a newcomer takes it by least attained service; with keep 1/2 it is
    # held (its wait, 6,700 s, is past half its bound, 2 x 1,900 = 3,800 s) and only an older starving
    # job may take it.
    let_in = running("let-in", 8, submitted_s_ago=6700.0, ran_s=1300.0)
    newcomer = pending("newcomer", 1, waited_s=10.0)
    assert not GUARD.starving(Standing(0.0, 8, let_in.attained_gpu_s, 0.0), now_s=6700.0)
    (eviction,) = run_cycle([newcomer], state_with(let_in), NOW, GPUYARD).evicted
    assert eviction.rule == "least attained service"
    sticky = replace(GPUYARD, starvation=replace(GUARD, keep=0.5))
    assert run_cycle([newcomer], state_with(let_in), NOW, sticky).evicted == []
    older = pending("older", 8, waited_s=30_000.0, attained_gpu_s=8 * 2000.0)  # starving, older
    assert [e.rule for e in run_cycle([older], state_with(let_in), NOW, sticky).evicted] == ["starvation"]


def test_under_overload_the_bound_stretches_by_the_fleets_demand() -> None:
    # bound = factor x (run + floor) x max(1, share) x max(1, demand), demand = GPUs asked by the queued
    # and the running jobs over the fleet's GPUs: under overload some jobs wait whatever the order.
    stretched = replace(GUARD, overload=True)
    assert stretched.bound_s(Standing(0.0, 8, 8 * 1000.0, 0.5, 0.5)) == pytest.approx(6400.0)
    assert stretched.bound_s(Standing(0.0, 8, 8 * 1000.0, 0.5, 2.0)) == pytest.approx(12800.0)
    assert stretched.bound_s(Standing(0.0, 8, 8 * 1000.0, 2.0, 3.0)) == pytest.approx(38400.0)
    assert GUARD.bound_s(Standing(0.0, 8, 8 * 1000.0, 0.5, 3.0)) == pytest.approx(6400.0)
    # held for: its wait grows by 1 per second run, its bound by factor x stretch = 4 x 2 = 8
    assert stretched.held_for_s(Standing(0.0, 8, 8 * 1000.0, 0.5, 2.0), now_s=14_200.0) == pytest.approx(
        200.0
    )
    served = pending("served", 8, waited_s=7000.0, attained_gpu_s=8 * 1000.0)  # past 6,400 s
    short = running("short", 8, submitted_s_ago=300.0, ran_s=200.0)
    alone = state_with(short)
    demand = stretched.demand(served.gpus, sum(alone.usage.values()), 8)
    assert demand == pytest.approx(2.0)  # 8 queued + 8 running over 8
    assert GUARD.demand(served.gpus, sum(alone.usage.values()), 8) == 1.0  # without `overload`
    assert GUARD.starving_jobs([served], alone, NOW) == {"served"}
    assert stretched.starving_jobs([served], alone, NOW, demand=demand) == frozenset()
    overloaded = replace(GPUYARD, starvation=stretched)
    assert run_cycle([served], state_with(short), NOW, overloaded).evicted == []
    (eviction,) = run_cycle([served], state_with(short), NOW, GPUYARD).evicted
    assert eviction.rule == "starvation"
    # Past the stretched bound (12,800 s at demand 2) it is starving again and takes the short run.
    later = replace(served, submitted_at=NOW - timedelta(seconds=13_000.0))
    assert [e.rule for e in run_cycle([later], state_with(short), NOW, overloaded).evicted] == ["starvation"]


def test_a_starving_job_that_takes_younger_jobs_only_spares_an_older_one() -> None:
    served = pending("served", 8, waited_s=20_000.0, attained_gpu_s=8 * 2000.0)  # starving
    older = running("older", 8, submitted_s_ago=30_000.0, ran_s=25_000.0)  # not held: 4 x (25,000 + 600)
    younger = running("younger", 8, submitted_s_ago=15_000.0, ran_s=14_000.0)
    assert not GUARD.held(Standing(NOW.timestamp() - 30_000.0, 8, older.attained_gpu_s, 0.0), NOW.timestamp())
    assert [e.rule for e in run_cycle([served], state_with(older), NOW, GPUYARD).evicted] == ["starvation"]
    fcfs = replace(GPUYARD, starvation=replace(GUARD, takes_younger_only=True))
    assert run_cycle([served], state_with(older), NOW, fcfs).evicted == []
    (eviction,) = run_cycle([served], state_with(younger), NOW, fcfs).evicted
    assert eviction.attempt.attempt_id == "younger" and eviction.rule == "starvation"


def test_gpuyards_guard_is_the_stated_one() -> None:
    guard = POLICIES["gpuyard"].starvation
    assert guard == StarvationGuard(factor=15.0, floor_s=600.0, overload=True, takes_younger_only=True)
