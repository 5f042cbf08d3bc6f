"""The public Tiresias simulator's model (sim/reference.py) on tiny hand-made traces: YARN keeps a big
gang on whole nodes of one switch, `count` places anywhere, FIFO stops at its head, DLAS-GPU demotes
at its threshold at once, yields without a minimum run and takes the most-served work first; with the
public order (`dlas_entry`) a queue is served by entry, a job that ran ahead of those that waited."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.scheduler.placements import yarn_shape, yarn_slices
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob, RunningAttempt
from gpuyard.sim.engine import JobResult, LeaseRecord, SimResult
from gpuyard.sim.reference import REFERENCE_CONFIG, VARIANTS, QueueEntryOrder, count_fleet
from gpuyard.sim.run import simulate
from gpuyard.sim.trace import TraceJob

T0 = datetime(2017, 10, 1, tzinfo=UTC)


def job(name: str, at_s: float, duration_s: float, gpus: int) -> TraceJob:
    return TraceJob(name, "a", T0 + timedelta(seconds=at_s), duration_s, gpus)


def run(
    variant: str, trace: list[TraceJob], nodes: int, leases: list[LeaseRecord] | None = None
) -> SimResult:
    chosen = VARIANTS[variant]
    observer = None if leases is None else leases.append
    return simulate(trace, chosen.fleet(nodes), chosen.build(), REFERENCE_CONFIG, observer=observer)


def by_id(result: SimResult) -> dict[str, JobResult]:
    return {j.id: j for j in result.jobs}


def test_yarn_shape_is_whole_nodes_and_the_remainder() -> None:
    assert yarn_slices(12, 8) == [8, 4]
    assert yarn_slices(16, 8) == [8, 8]
    assert yarn_slices(5, 8) == [5]
    assert yarn_shape(20, 8) == (3, 20)  # never rounded up to even slices (3 x 7)


def test_yarn_gang_waits_for_two_whole_nodes_under_one_switch() -> None:
    # 7 whole-node jobs fill switch 0 (n0..n3) and n4..n6 of switch 1; x3 frees n3 at 100 s. At 200 s
    # two nodes are wholly free (n3, n7) but under different switches: the 16-GPU gang waits for 1,000 s.
    fill = [job(f"x{i}", 0, 100 if i == 3 else 1000, 8) for i in range(7)]
    trace = [*fill, job("big", 200, 50, 16)]
    leases: list[LeaseRecord] = []
    yarn = by_id(run("fifo_yarn", trace, 8, leases))
    assert yarn["big"].first_start_s == pytest.approx(1000)
    (placed,) = [r.placement for r in leases if r.job_id == "big" and r.kind == "start"]
    assert [len(s.gpu_indices) for s in placed.slices] == [8, 8]
    assert len({s.node for s in placed.slices}) == 2
    # By count the same GPUs start it at once.
    assert by_id(run("fifo_count", trace, 8))["big"].first_start_s == pytest.approx(200)


def test_yarn_puts_the_remainder_on_a_partly_used_node() -> None:
    leases: list[LeaseRecord] = []
    trace = [job("small", 0, 1000, 4), job("twelve", 1, 100, 12)]
    result = by_id(run("fifo_yarn", trace, 4, leases))
    assert result["twelve"].first_start_s == pytest.approx(1)
    (placed,) = [r.placement for r in leases if r.job_id == "twelve" and r.kind == "start"]
    assert sorted(len(s.gpu_indices) for s in placed.slices) == [4, 8]  # 8 on n1, 4 beside "small"
    assert placed.gpus == 12


def test_fifo_by_count_places_across_nodes_and_stops_at_its_head() -> None:
    # Two 5-GPU jobs leave 3 + 3 GPUs on two nodes: by count a 6-GPU job fits at once, by YARN never
    # on one node until one ends. Strict FIFO: the 1-GPU job waits behind the head that does not fit.
    trace = [job("a", 0, 1000, 5), job("b", 0, 1000, 5), job("six", 1, 100, 6), job("head", 2, 100, 8)]
    trace.append(job("one", 3, 100, 1))
    count = by_id(run("fifo_count", trace, 2))
    assert count["six"].first_start_s == pytest.approx(1)
    assert count["head"].first_start_s == pytest.approx(1000)
    assert count["one"].first_start_s == pytest.approx(1000)  # 1 GPU free at 3 s, but behind the head
    assert by_id(run("fifo_yarn", trace, 2))["six"].first_start_s == pytest.approx(1000)


def test_dlas_demotes_at_its_threshold_and_yields_at_once() -> None:
    # 8 GPUs. a (8 GPUs) reaches 3,250 GPU-s at 406.25 s: b, queued in Q0 since 100 s behind a (first
    # come, first served in a queue), starts then, not when a ends.
    trace = [job("a", 0, 10000, 8), job("b", 100, 100, 8)]
    result = by_id(run("dlas", trace, 1))
    assert result["b"].first_start_s == pytest.approx(406.25)
    assert result["a"].finished_s == pytest.approx(10100)
    assert result["a"].pending_s == pytest.approx(100)  # its time queued while b ran


def test_dlas_preempts_without_a_minimum_run() -> None:
    # a (Q1 by then) yields to b at 500 s and resumes at 600 s; c comes 50 s later and takes its GPUs
    # at once (no quantum before a fair-share preemption in the public model).
    trace = [job("a", 0, 10000, 8), job("b", 500, 100, 8), job("c", 650, 100, 8)]
    result = by_id(run("dlas", trace, 1))
    assert result["b"].first_start_s == pytest.approx(500)
    assert result["c"].first_start_s == pytest.approx(650)
    assert result["a"].attempts == 3


def test_dlas_takes_the_most_served_queue_first() -> None:
    # At 4,000 s: a (1 GPU, 4,000 GPU-s: Q1, started first) and b (4 GPUs, ~16,000 GPU-s: Q2) run, 3 GPUs
    # free; c (4 GPUs, Q0) needs one more. The public pass preempts from the end of its order: b.
    trace = [job("a", 0, 20000, 1), job("b", 10, 20000, 4), job("c", 4000, 100, 4)]
    result = by_id(run("dlas", trace, 1))
    assert result["c"].first_start_s == pytest.approx(4000)
    assert result["a"].attempts == 1
    assert result["b"].attempts == 2


def starts(leases: list[LeaseRecord], job_id: str) -> list[float]:
    return [r.at_s for r in leases if r.job_id == job_id and r.kind == "start"]


def test_dlas_entry_serves_a_queue_by_entry_not_submission() -> None:
    # 8 GPUs. b (4 GPUs, submitted after a) crosses 3,250 GPU-s at 822.5 s, a (2 GPUs) at 1,625 s: both
    # in Q1, b entered first. c (8 GPUs, Q0) takes both at 1,700 s; at 1,800 s it ends, d (Q0) takes
    # 4 GPUs and 4 are left for one of them. The public order resumes b (entered Q1 first); ours by
    # submission resumes a, and b waits for d to end.
    trace = [job("a", 0, 20000, 2), job("b", 10, 20000, 4), job("c", 1700, 100, 8), job("d", 1750, 1000, 4)]
    entry: list[LeaseRecord] = []
    run("dlas_entry", trace, 1, entry)
    assert starts(entry, "b")[:2] == pytest.approx([10, 1800])
    assert starts(entry, "a")[:2] == pytest.approx([0, 1910])  # when b reaches Q2 (7,200 GPU-s)
    submitted: list[LeaseRecord] = []
    run("dlas", trace, 1, submitted)
    assert starts(submitted, "a")[:2] == pytest.approx([0, 1800])
    assert starts(submitted, "b")[:2] == pytest.approx([10, 2800])


def pending(name: str, submitted_s: float, attained_gpu_s: float) -> PendingJob:
    return PendingJob(
        name, "a", 1, 1, (), 0, True, T0 + timedelta(seconds=submitted_s), attained_gpu_s=attained_gpu_s
    )


def running(name: str, submitted_s: float, attained_gpu_s: float) -> RunningAttempt:
    placement = Placement("s", "c", "d", (NodeSlice("n0", (0,)),))
    return RunningAttempt(
        f"{name}-a1",
        name,
        "a",
        0,
        True,
        placement,
        T0,
        None,
        attained_gpu_s=attained_gpu_s,
        submitted_at=T0 + timedelta(seconds=submitted_s),
    )


def test_entry_order_puts_a_job_that_ran_ahead_of_those_that_waited() -> None:
    # p waits in Q1; r, submitted later, enters Q1 while running, then is preempted: it waits ahead of p
    # (the public pass moves the jobs that ran ahead of those that waited, each keeping its order).
    state = ClusterState.empty(FleetIndex(count_fleet(1)), {})
    order = QueueEntryOrder()
    now = T0 + timedelta(seconds=10000)
    p = pending("p", 0, 4000)

    def ordered(jobs: list[PendingJob], runs: list[RunningAttempt]) -> list[str]:
        state.running = runs
        return [j.id for j in order(jobs, state, now, frozenset())]

    assert ordered([p], [running("r", 5, 100)]) == ["p"]  # r in Q0
    assert ordered([p], [running("r", 5, 4000)]) == ["p"]  # r enters Q1, behind p
    assert ordered([p], [running("r", 5, 5000)]) == ["p"]  # r ran this pass: ahead of p from now on
    assert ordered([p, pending("r", 5, 5000)], []) == ["r", "p"]  # r was preempted
    assert ordered([pending("q", 1, 0), p, pending("r", 5, 5000)], []) == ["q", "r", "p"]  # Q0 first
