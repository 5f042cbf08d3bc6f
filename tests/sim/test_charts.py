"""The simulator's chart (sim/charts.py) and `gpuyard sim`'s narrow and wide tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from gpuyard.sim.charts import (
    ElasticRun,
    Recorder,
    over_time,
    write_chart,
    write_elastic_chart,
    write_ratio_grid,
)
from gpuyard.sim.cli import sim
from gpuyard.sim.engine import SimConfig
from gpuyard.sim.fleet_builder import standard_fleet, write_fleet
from gpuyard.sim.run import simulate
from gpuyard.sim.trace import read_trace
from typer.testing import CliRunner

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"
ROWS = [  # 12 one-GPU hours at once on 8 GPUs: 4 wait an hour for the first 8 to finish
    *(f"2017-10-01 00:00:{i:02d},3600.0,1,3600.0,team{i % 3}" for i in range(12)),
    "2017-10-01 05:00:00,60.0,1,60.0,team0",
]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("\n".join([HEADER, *ROWS]) + "\n")
    return path


def test_queue_and_utilization_come_from_the_leases(tmp_path: Path) -> None:
    jobs = read_trace(_trace(tmp_path), None, None, 0.0)
    fleet = standard_fleet(nodes=1, gpus_per_node=8, preemptible_nodes=0)
    recorder = Recorder()
    result = simulate(jobs, fleet, "fifo", SimConfig(preemptible_mtbi_s=None), observer=recorder.record)
    hours, waiting, utilization, exact = over_time(result, recorder)
    assert exact and hours[-1] == 5.0  # the submit window
    assert max(waiting) == 4 and max(utilization) == 1.0  # 12 jobs on 8 GPUs
    half = min(range(len(hours)), key=lambda k: abs(hours[k] - 0.5))
    assert (waiting[half], utilization[half]) == (4, 1.0)
    after = min(range(len(hours)), key=lambda k: abs(hours[k] - 1.5))  # the 4 run, nobody waits
    assert (waiting[after], utilization[after]) == (0, 0.5)
    derived = over_time(result, None)
    assert not derived[3] and max(derived[1]) == 4  # without leases: first start to finish
    png = write_chart([(result, recorder)], tmp_path / "charts" / "run.png", title="twelve jobs")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_cli_prints_a_narrow_table_and_writes_the_chart(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(sim)
    fleet = tmp_path / "fleet.yaml"
    write_fleet(standard_fleet(nodes=1, gpus_per_node=8, preemptible_nodes=0), fleet)
    chart = tmp_path / "out.png"
    args = ["--trace", str(_trace(tmp_path)), "--fleet", str(fleet), "--policy", "fifo,gpuyard"]
    narrow = CliRunner().invoke(app, [*args, "--chart", str(chart)])
    assert narrow.exit_code == 0, narrow.output
    assert max(len(line) for line in narrow.output.splitlines()) <= 100
    assert "avg JCT h" in narrow.output and "Jain" not in narrow.output and "--wide" in narrow.output
    assert f"chart: {chart}" in narrow.output and chart.read_bytes()[:4] == b"\x89PNG"
    wide = CliRunner().invoke(app, [*args, "--wide", "--chart", "-"])
    assert wide.exit_code == 0 and "Jain" in wide.output and "chart:" not in wide.output


def test_the_weeks_grid_is_a_png_of_every_cell_and_refuses_an_empty_table(tmp_path: Path) -> None:
    path = write_ratio_grid(
        ["09-03..09-10", "10-22..10-29"],
        ["40 nodes", "64 nodes"],
        [[1.0, 0.99], [1.1, float("inf")]],
        tmp_path / "grid.png",
        "gpuyard / tiresias",
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    with pytest.raises(ValueError, match="at least one row"):
        write_ratio_grid([], ["40 nodes"], [], tmp_path / "none.png", "empty")


def test_the_elastic_chart_is_a_png_of_every_workload_and_refuses_no_replay(tmp_path: Path) -> None:
    runs = [
        ElasticRun(workload, policy, [0.1 * k for k in range(1, 9)], 0.8)
        for workload in ("workload-1.csv", "workload-2.csv")
        for policy in ("tiresias", "gpuyard")
    ]
    published = {"workload-1.csv": {"Tiresias": 0.687, "Pollux": 0.580}}
    png = write_elastic_chart(runs, published, tmp_path / "charts" / "pollux.png", "two workloads")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    with pytest.raises(ValueError, match="at least one replay"):
        write_elastic_chart([], published, tmp_path / "none.png", "none")
