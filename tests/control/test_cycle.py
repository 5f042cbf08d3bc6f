"""The pure scheduling cycle: placement inside one domain, packing, reservations, admission, preemption."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.cycle import NO_ROOM, admit, run_cycle
from gpuyard.scheduler.plugins import SCORES
from gpuyard.scheduler.policy import POLICIES, Policy, fifo_order, las_order
from gpuyard.scheduler.preemption import RULES
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob, RunningAttempt

from .test_scheduler_service import two_domains

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
FLEET = two_domains(8)  # 8 GPUs a node
QUOTAS = {"a": TeamQuota(gpu_quota=16, cohort="all"), "b": TeamQuota(gpu_quota=16, cohort="all")}


def job(
    name: str,
    gpus: int,
    nodes: int = 1,
    *,
    team: str = "a",
    priority: int = 1,
    age_s: int = 0,
    preemptible: bool = True,
) -> PendingJob:
    return PendingJob(
        id=name,
        team=team,
        gpus=gpus,
        nodes=nodes,
        gpu_types=("a100",),
        priority=priority,
        preemptible=preemptible,
        submitted_at=NOW - timedelta(seconds=1000 - age_s),
    )


def running(
    attempt_id: str,
    node: str,
    gpus: int,
    *,
    team: str = "a",
    priority: int = 0,
    checkpoint_age_s: float = 0,
    borrowed: bool = False,
) -> RunningAttempt:
    return RunningAttempt(
        attempt_id=attempt_id,
        job_id=f"job-{attempt_id}",
        team=team,
        priority=priority,
        preemptible=True,
        placement=Placement("east", "c", node[:2], (NodeSlice(node, tuple(range(gpus))),)),
        started_at=NOW - timedelta(hours=1),
        last_checkpoint_at=NOW - timedelta(seconds=checkpoint_age_s),
        borrowed=borrowed,
    )


def state_with(*attempts: RunningAttempt) -> ClusterState:
    state = ClusterState.empty(FleetIndex(FLEET), QUOTAS)
    for attempt in attempts:
        state.take(attempt.team, attempt.placement, borrowed=attempt.borrowed)
        state.running.append(attempt)
    return state


def test_small_jobs_are_packed_so_a_gang_finds_a_whole_domain() -> None:
    jobs = [job("small1", 2, age_s=0), job("small2", 4, age_s=1), job("gang", 16, nodes=2, age_s=2)]
    result = run_cycle(jobs, state_with(), NOW, POLICIES["gpuyard"])
    placed = {p.job.id: p.placement for p in result.placed}
    assert set(placed) == {"small1", "small2", "gang"}
    assert placed["small1"].domain == placed["small2"].domain != placed["gang"].domain
    assert len(set(placed["gang"].nodes)) == 2 and placed["gang"].gpus == 16


def test_a_gang_is_never_split_across_domains() -> None:
    # 8 free GPUs in each domain (16 in all) but no domain holds 16: the gang waits.
    state = state_with(running("x", "d0n0", 8, priority=5), running("y", "d1n0", 8, priority=5))
    result = run_cycle([job("gang", 16, nodes=2)], state, NOW, POLICIES["fifo-backfill"])
    assert result.placed == [] and "gang" in result.waiting


def test_a_backlog_of_one_kind_waits_with_its_reason_and_later_kinds_still_start() -> None:
    # 12 free GPUs on d0n1 and d1n1, none elsewhere: a backlog of 8-GPU jobs of team a cannot start,
    # every one of them is told why, and 1-GPU jobs queued behind them still start.
    state = state_with(
        running("x", "d0n0", 8, priority=5),
        running("y", "d1n0", 8, priority=5),
        running("z", "d0n1", 2, priority=5),
        running("w", "d1n1", 2, priority=5),
    )
    backlog = [job(f"big{i}", 8, age_s=i) for i in range(200)]
    small = [job(f"small{i}", 1, team="b", age_s=300 + i) for i in range(3)]
    result = run_cycle(backlog + small, state, NOW, POLICIES["kueue"])
    assert sorted(p.job.id for p in result.placed) == ["small0", "small1", "small2"]
    assert {result.waiting[j.id] for j in backlog} == {NO_ROOM}


def test_head_gang_reservation_keeps_backfill_off_its_domain() -> None:
    # d0 has 8 GPUs busy, d1 is free: the 16-GPU gang is placed on d1. A second gang has no domain
    # and reserves the one with most free GPUs; a later small job must not take GPUs there.
    state = state_with(running("x", "d0n0", 4, priority=5))
    jobs = [job("gang1", 16, nodes=2, age_s=0), job("gang2", 16, nodes=2, age_s=1), job("small", 2, age_s=2)]
    result = run_cycle(jobs, state, NOW, POLICIES["fifo-backfill"])
    assert [p.job.id for p in result.placed] == ["gang1"]
    assert result.reserved_for == {"gang2": ("east", "c", "d0")}
    fifo = run_cycle(jobs, state_with(running("x", "d0n0", 4, priority=5)), NOW, POLICIES["fifo"])
    assert [p.job.id for p in fifo.placed] == ["gang1"]  # strict FIFO stops at the first misfit


def test_priority_preemption_picks_the_victim_losing_least_unsaved_progress() -> None:
    state = state_with(
        running("fresh-ckpt", "d0n0", 8, checkpoint_age_s=60),
        running("old-ckpt", "d0n1", 8, checkpoint_age_s=3000),
        running("mid-ckpt", "d1n0", 8, checkpoint_age_s=600),
        running("also", "d1n1", 8, checkpoint_age_s=1200),
    )
    result = run_cycle([job("urgent", 8, priority=2)], state, NOW, POLICIES["gpuyard"])
    assert [e.attempt.attempt_id for e in result.evicted] == ["fresh-ckpt"]
    assert "priority" in result.evicted[0].reason
    # next cycle: the victim is stopping; nothing else is evicted while the job waits for it
    state.running = [replace(a, stopping=a.attempt_id == "fresh-ckpt") for a in state.running]
    again = run_cycle([job("urgent", 8, priority=2)], state, NOW, POLICIES["gpuyard"])
    assert again.evicted == [] and "urgent" in again.reserved_for


def test_no_preemption_of_equal_priority_under_fifo_policies() -> None:
    state = state_with(*(running(f"r{i}", f"d{i // 2}n{i % 2}", 8, priority=1) for i in range(4)))
    for name in ("fifo", "fifo-backfill"):
        assert run_cycle([job("j", 8, priority=2)], state, NOW, POLICIES[name]).evicted == []


def test_quota_admission_borrows_from_the_cohort_and_reclaims() -> None:
    state = state_with()
    assert admit(job("a1", 16), state) == "nominal"
    state.usage["a"] = 16
    assert admit(job("a2", 8), state) == "borrow"  # b's quota is idle
    state.usage["b"] = 16
    assert admit(job("a3", 8), state) is None
    # team a borrowed 16 GPUs of b's quota; b now needs them back
    borrowed = state_with(
        running("a-own1", "d0n0", 8, priority=1),
        running("a-own2", "d0n1", 8, priority=1),
        running("a-borrow1", "d1n0", 8, priority=1, borrowed=True),
        running("a-borrow2", "d1n1", 8, priority=1, borrowed=True),
    )
    result = run_cycle([job("b1", 8, team="b")], borrowed, NOW, POLICIES["kueue"])
    assert [e.attempt.attempt_id for e in result.evicted] in (["a-borrow1"], ["a-borrow2"])
    assert "reclaim" in result.evicted[0].reason


def test_placement_respects_type_and_spot_taints() -> None:
    fleet = Fleet(
        nodes=(
            Node(
                name="spot",
                site="s",
                cluster="c",
                domain="d1",
                gpu_type="t4",
                gpus=4,
                preemptible=True,
                taints=("gpuyard.io/spot",),
            ),
            Node(name="ondemand", site="s", cluster="c", domain="d2", gpu_type="t4", gpus=4),
        )
    )
    state = ClusterState.empty(FleetIndex(fleet), {"a": TeamQuota(gpu_quota=8)})
    steady = PendingJob(
        id="steady",
        team="a",
        gpus=4,
        nodes=1,
        gpu_types=("t4",),
        priority=1,
        preemptible=False,
        submitted_at=NOW,
    )
    flexible = PendingJob(
        id="flex",
        team="a",
        gpus=4,
        nodes=1,
        gpu_types=("t4",),
        priority=1,
        preemptible=True,
        submitted_at=NOW + timedelta(seconds=1),
    )
    result = run_cycle([steady, flexible], state, NOW, POLICIES["gpuyard"])
    assert {p.job.id: p.placement.nodes for p in result.placed} == {
        "steady": ("ondemand",),
        "flex": ("spot",),
    }


def test_a_job_is_placed_only_on_nodes_that_hold_its_cpu_and_memory() -> None:
    """The small node is free and packs best, but could never hold the job's memory: a pod there
    would wait Pending for ever. A node that does not say what it has is not held to it."""
    nodes = [("small", 16, 64), ("large", 64, 512), ("unsaid", None, None)]
    fleet = Fleet(
        nodes=tuple(
            Node(name=n, site="s", cluster="c", domain=n, gpu_type="a100", gpus=8, cpu=cpu, memory_gb=mem)
            for n, cpu, mem in nodes
        )
    )

    def placed_with_full(busy: str) -> list[tuple[str, ...]]:
        state = ClusterState.empty(FleetIndex(fleet), {"a": TeamQuota(gpu_quota=24)})
        state.take("a", Placement("s", "c", busy, (NodeSlice(busy, tuple(range(8))),)), borrowed=False)
        hungry = replace(job(f"hungry-{busy}", 2), memory_gb=256.0, cpu=32.0)
        return [p.placement.nodes for p in run_cycle([hungry], state, NOW, POLICIES["gpuyard"]).placed]

    assert placed_with_full("unsaid") == [("large",)]
    assert placed_with_full("large") == [("unsaid",)]


def test_a_reserved_gang_holds_only_the_nodes_it_needs() -> None:
    # No node has 8 free GPUs: the 8-GPU gang reserves d0 (most free) but holds one node of it only,
    # so a 4-GPU job still starts on the other node of d0.
    state = state_with(
        running("x", "d0n0", 4, priority=5),
        running("y", "d0n1", 4, priority=5),
        running("z", "d1n0", 8, priority=5),
        running("w", "d1n1", 6, priority=5),
    )
    jobs = [job("gang", 8, age_s=0), job("small", 4, age_s=1)]
    result = run_cycle(jobs, state, NOW, POLICIES["fifo-backfill"])
    assert result.reserved_for == {"gang": ("east", "c", "d0")}
    assert [(p.job.id, p.placement.nodes) for p in result.placed] == [("small", ("d0n1",))]


def test_a_less_served_job_takes_gpus_of_a_more_served_team_even_within_its_quota() -> None:
    # a is at its quota, b borrows 8 GPUs of c's idle quota, the cohort is full. A new 1-GPU job of
    # a (least attained service) may take a settled attempt of any other team that has had more
    # service, c's within its quota too (the order puts less-served work first), or a's own, and it
    # picks the one losing least unsaved progress.
    quotas = {
        "a": TeamQuota(gpu_quota=8, cohort="all"),
        "b": TeamQuota(gpu_quota=8, cohort="all"),
        "c": TeamQuota(gpu_quota=16, cohort="all"),
    }
    served = 10 * 3600.0
    attempts = [
        replace(running("a-own", "d0n0", 8, team="a", checkpoint_age_s=900), attained_gpu_s=served),
        replace(running("b-own", "d0n1", 8, team="b", checkpoint_age_s=900), attained_gpu_s=served),
        replace(
            running("b-borrow", "d1n0", 8, team="b", borrowed=True, checkpoint_age_s=900),
            attained_gpu_s=served,
        ),
        replace(running("c-own", "d1n1", 8, team="c", checkpoint_age_s=60), attained_gpu_s=served),
    ]

    def fresh() -> ClusterState:
        state = ClusterState.empty(FleetIndex(FLEET), quotas)
        for attempt in attempts:
            state.take(attempt.team, attempt.placement, borrowed=attempt.borrowed)
            state.running.append(attempt)
        return state

    new = job("a-new", 1, team="a", priority=0)
    state = fresh()
    assert admit(new, state) is None
    result = run_cycle([new], state, NOW, POLICIES["gpuyard"])
    (eviction,) = result.evicted
    assert eviction.attempt.attempt_id == "c-own" and "least attained service" in eviction.reason
    assert result.reserved_for == {"a-new": ("east", "c", "d1")}
    attempts[0] = replace(attempts[0], last_checkpoint_at=NOW)  # now a's own loses least
    (eviction,) = run_cycle([new], fresh(), NOW, POLICIES["gpuyard"]).evicted
    assert eviction.attempt.attempt_id == "a-own" and "least attained service" in eviction.reason
    # A job that has had as much service takes nothing: evictions agree with the order.
    assert run_cycle([replace(new, attained_gpu_s=served)], fresh(), NOW, POLICIES["gpuyard"]).evicted == []
    # Kueue orders by priority and age only: no attained service, and c is within its quota.
    assert run_cycle([new], fresh(), NOW, POLICIES["kueue"]).evicted == []
    # Attempts placed a minute ago are spared: the minimum run keeps rules from ping-ponging.
    attempts[:] = [replace(a, started_at=NOW - timedelta(seconds=60)) for a in attempts]
    assert run_cycle([new], fresh(), NOW, POLICIES["gpuyard"]).evicted == []


def test_gpuyard_takes_borrowed_gpus_back_only_from_more_served_work() -> None:
    # b borrowed a's idle quota for two 8-GPU jobs; a now needs 8 GPUs back. Under gpuyard the
    # 2D-LAS order decides, not the quota: a borrower that has had less service than a's job keeps
    # its GPUs, one in the same queue too (first come, first served there: no reclaim), and one that
    # has had more is taken by least attained service.
    def borrowed_by_b(attained_gpu_s: float) -> ClusterState:
        return state_with(
            *(
                replace(
                    running(f"b{i}", f"d{i // 2}n{i % 2}", 8, team="b", priority=1, borrowed=i >= 2),
                    attained_gpu_s=attained_gpu_s,
                )
                for i in range(4)
            )
        )

    fresh_job, served_job = job("a-new", 8), replace(job("a-old", 8), attained_gpu_s=10 * 3600.0)
    for pending, borrower_served in ((served_job, 100.0), (served_job, 10 * 3600.0), (fresh_job, 100.0)):
        assert run_cycle([pending], borrowed_by_b(borrower_served), NOW, POLICIES["gpuyard"]).evicted == []
    result = run_cycle([fresh_job], borrowed_by_b(10 * 3600.0), NOW, POLICIES["gpuyard"])
    assert len(result.evicted) == 1 and result.evicted[0].rule == "least attained service"
    # Kueue reclaims whatever the service.
    result = run_cycle([served_job], borrowed_by_b(100.0), NOW, POLICIES["kueue"])
    assert [e.attempt.attempt_id for e in result.evicted] in (["b2"], ["b3"])


def test_a_policy_names_its_plugins_and_rules_and_an_unknown_name_is_refused_as_it_is_built() -> None:
    known = "expected one of ['checkpoint_locality', 'data_locality', 'pack', 'price', 'spot_fit']"
    with pytest.raises(ValueError, match=re.escape(f"policy 'x': unknown score 'packing'; {known}")):
        Policy("x", fifo_order, scores=(("packing", 1.0),))
    with pytest.raises(ValueError, match="policy 'x': unknown filter 'gpu'"):
        Policy("x", fifo_order, filters=("gpu",))
    with pytest.raises(ValueError, match="policy 'x': unknown preemption rule 'lottery'"):
        Policy("x", fifo_order, preemption=("lottery",))
    with pytest.raises(ValueError, match="'starvation' needs a starvation guard"):
        Policy("x", las_order, preemption=("starvation",))
    # Whether a policy preempts is whether it names a rule; rules apply in the table's order.
    assert [name for name, policy in POLICIES.items() if policy.preempts] == [
        "kueue",
        "tiresias",
        "gpuyard",
        "stay",
    ]
    with pytest.raises(ValueError, match="policy 'x': unknown site rule 'nearest'"):
        Policy("x", fifo_order, sites="nearest")
    assert Policy("y", las_order, preemption=("reclaim", "priority")).rules == (
        RULES["priority"],
        RULES["reclaim"],
    )


def test_a_new_score_is_one_registry_entry_that_a_policy_names(monkeypatch: pytest.MonkeyPatch) -> None:
    def spread(job: PendingJob, nodes: list[Node], state: ClusterState) -> float:
        """The emptiest domain first: the opposite of `pack`."""
        return 100.0 * state.domain_free()[nodes[0].domain_key] / 16

    monkeypatch.setitem(SCORES, "spread", spread)
    state = state_with(running("x", "d0n0", 4))
    packed = run_cycle([job("small", 2)], state, NOW, POLICIES["fifo-backfill"]).placed
    spreading = Policy("spreading", fifo_order, scores=(("spread", 1.0),))
    spread_out = run_cycle([job("small", 2)], state_with(running("x", "d0n0", 4)), NOW, spreading).placed
    assert [p.placement.domain for p in packed] == ["d0"] and [p.placement.domain for p in spread_out] == [
        "d1"
    ]
