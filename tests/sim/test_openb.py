"""The Alibaba OpenB replay: pods and nodes read from files in the trace's format, GPU-model
constraints honoured, fractional requests counted, stranded GPUs measured; and the slowdown tails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.sim.engine import LeaseRecord, SimConfig
from gpuyard.sim.metrics import slowdown, stranded_over_time, summarize
from gpuyard.sim.openb import read_nodes, read_pods
from gpuyard.sim.run import simulate
from gpuyard.sim.trace import TraceError, TraceJob

from .test_simulator import write_trace

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


PODS = [
    "p-whole,8000,1024,2,1000,,LS,Running,100,1100,100",
    "p-typed,8000,1024,1,1000,V100M16|V100M32,BE,Running,200,800,250",
    "p-share,4000,1024,1,460,nan,BE,Running,300,900,300",
    "p-cpu,4000,1024,0,0,,BE,Running,400,500,400",
    "p-never,4000,1024,1,1000,,BE,Pending,500,600,",
    "p-late,4000,1024,1,1000,,LS,Running,9000,9100,9000",
]


def test_pods_become_jobs_with_their_models_and_the_rest_is_counted(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "pods.csv", PODS, POD_HEADER)
    jobs, counts = read_pods(path, end_s=5000)
    assert [(j.id, j.team, j.gpus, j.gpu_types, j.duration_s, j.gpu_share) for j in jobs] == [
        ("p-whole", "LS", 2, (), 1000.0, 1.0),
        ("p-typed", "BE", 1, ("V100M16", "V100M32"), 550.0, 1.0),  # runs from scheduled_time
        ("p-share", "BE", 1, (), 600.0, 0.46),  # placed on a whole GPU, 46% of it counts as kept
    ]
    assert counts.skipped == {"no GPU": 1, "never scheduled in the trace": 1}
    assert counts.fractional_placed_whole == 1
    skipped, counts = read_pods(path, fractional="skip", speedup=100.0)
    assert [j.id for j in skipped] == ["p-whole", "p-typed", "p-late"] and counts.skipped[
        "fractional GPU"
    ] == 1
    assert skipped[-1].submitted_at.timestamp() == pytest.approx(90.0)  # 9000 s compressed 100 times
    assert skipped[-1].duration_s == 100.0  # run times are not


def test_bad_pod_and_node_rows_are_named(tmp_path: Path) -> None:
    bad = write_trace(tmp_path / "bad.csv", [PODS[0], "p2,1,1,two,1000,,LS,Running,1,2,1"], POD_HEADER)
    with pytest.raises(TraceError, match=r"row 3, column 'num_gpu': expected a whole number >= 0, got 'two'"):
        read_pods(bad)
    backwards = write_trace(tmp_path / "back.csv", ["p,1,1,1,1000,,LS,Running,10,5,10"], POD_HEADER)
    with pytest.raises(TraceError, match=r"row 2, column 'deletion_time': expected >= scheduled_time 10"):
        read_pods(backwards)
    twice = write_trace(tmp_path / "twice.csv", [PODS[0], PODS[0]], POD_HEADER)
    with pytest.raises(TraceError, match=r"row 3, column 'name'.*'p-whole' is on row 2"):
        read_pods(twice)
    missing = write_trace(tmp_path / "cols.csv", ["p,1"], "name,num_gpu")
    with pytest.raises(TraceError, match=r"missing column\(s\) \['gpu_milli', 'creation_time'"):
        read_pods(missing)
    rows = ["n1,64000,262144,2,T4", "n2,64000,262144,8,nan"]
    nodes = write_trace(tmp_path / "nodes.csv", rows, NODE_HEADER)
    with pytest.raises(TraceError, match=r"row 3, column 'model': expected a GPU model"):
        read_nodes(nodes)
    with pytest.raises(ValueError, match="speedup must be > 0"):
        read_pods(twice, speedup=0)


def test_a_share_of_the_nodes_keeps_the_mix(tmp_path: Path) -> None:
    rows = [f"t{i},1,1,2,T4" for i in range(8)] + [f"g{i},1,1,8,G2" for i in range(4)] + ["c,1,1,0,nan"]
    path = write_trace(tmp_path / "nodes.csv", rows, NODE_HEADER)
    whole = read_nodes(path)
    assert len(whole.nodes) == 12 and len(whole.domains()) == 12  # no CPU-only node; each its own domain
    quarter = read_nodes(path, share=0.25)
    assert sorted(n.name for n in quarter.nodes) == ["g0", "t0", "t4"]


def node(name: str, model: str, gpus: int) -> Node:
    return Node(
        name=name, site="s", cluster="c", domain=name, gpu_type=model, gpus=gpus, price_per_gpu_hour=1.0
    )


T0 = datetime(2023, 1, 1, tzinfo=UTC)


def job(i: int, at_s: float, duration_s: float, gpus: int, models: tuple[str, ...] = ()) -> TraceJob:
    return TraceJob(f"j{i}", "t", T0 + timedelta(seconds=at_s), duration_s, gpus, gpu_types=models)


def test_a_job_runs_only_on_its_models_and_one_no_node_offers_is_rejected() -> None:
    fleet = Fleet(nodes=(node("t4", "T4", 2), node("v100", "V100M32", 8)))
    starts: dict[str, tuple[str, ...]] = {}

    def observe(record: LeaseRecord) -> None:
        if record.kind == "start":
            starts[record.job_id] = record.placement.nodes

    trace = [job(0, 0, 100, 1, ("V100M32",)), job(1, 0, 100, 1, ("T4",)), job(2, 0, 100, 4, ("T4",))]
    result = simulate(trace, fleet, "gpuyard", SimConfig(preemptible_mtbi_s=None), observer=observe)
    assert starts == {"j0": ("v100",), "j1": ("t4",)}
    assert result.rejected == [("j2", "1 node(s) x 4 GPUs of T4 fit in no domain of the fleet")]


def test_free_gpus_no_queued_job_fits_are_stranded() -> None:
    # Two 2-GPU nodes: a 1-GPU job (1000 s) on one, a 2-GPU job on the other. A second 2-GPU job,
    # at 100 s, waits for a whole node while 1 GPU stays free: stranded until the first job ends.
    fleet = Fleet(nodes=(node("a", "T4", 2), node("b", "T4", 2)))
    trace = [job(0, 0, 1000, 1), job(1, 0, 5000, 2), job(2, 100, 500, 2), job(3, 2000, 10, 1)]
    config = SimConfig(preemptible_mtbi_s=None, checkpoint_cost_s=0.0, restore_s=0.0)
    result = simulate(trace, fleet, "fifo-backfill", config)
    assert result.stranded == [(0.0, 0), (100.0, 1), (1000.0, 0)]
    summary = summarize(result)
    assert summary.stranded_gpus == pytest.approx(900 / 2000)  # over the submit window, 0..2000 s
    assert stranded_over_time(result, 2) == pytest.approx([0.9, 0.0])


def test_slowdown_is_bounded_below_ten_seconds_and_tails_are_per_size_and_team() -> None:
    fleet = Fleet(nodes=(node("a", "T4", 8),))
    trace = [job(0, 0, 1000, 8), job(1, 0, 5, 1), job(2, 0, 100, 2)]
    result = simulate(trace, fleet, "fifo", SimConfig(preemptible_mtbi_s=None))
    by_id = {j.id: j for j in result.jobs}
    assert slowdown(by_id["j1"]) == pytest.approx((1000 + 5) / 10)  # waited for j0, floor 10 s
    summary = summarize(result)
    assert summary.slowdown_by_size["1 GPU"].worst == pytest.approx(100.5)
    assert summary.slowdown_by_size["2-8 GPUs"].jobs == 2 and summary.slowdown_by_size[">8 GPUs"].jobs == 0
    assert summary.slowdown_by_team["t"].worst == pytest.approx(100.5)
