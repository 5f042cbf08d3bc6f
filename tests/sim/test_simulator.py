"""The trace simulator: every policy finishes, leases stay exclusive, gangs stay in one domain,
interruptions lose only unsaved progress, runs are deterministic, the CLI and trace errors."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, load_fleet
from gpuyard.scheduler.policy import POLICIES
from gpuyard.scheduler.preemption import MIN_RUN_S
from gpuyard.scheduler.starvation import StarvationGuard
from gpuyard.sim.cli import sim
from gpuyard.sim.engine import LeaseRecord, SimConfig
from gpuyard.sim.fleet_builder import derive_quotas, standard_fleet, write_fleet
from gpuyard.sim.metrics import jain_index, summarize
from gpuyard.sim.run import POLICY_NAMES, simulate
from gpuyard.sim.trace import TraceError, TraceJob, read_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

T0 = datetime(2017, 10, 1, tzinfo=UTC)


def job(i: int, at_s: float, duration_s: float, gpus: int, team: str = "a") -> TraceJob:
    return TraceJob(f"j{i:04d}", team, T0 + timedelta(seconds=at_s), duration_s, gpus)


def mixed_trace(n: int = 60, seed: int = 1) -> list[TraceJob]:
    rng = random.Random(seed)
    return [
        job(
            i,
            i * 120.0,
            rng.choice([90.0, 600.0, 3000.0, 20000.0]),
            rng.choice([1, 1, 1, 2, 4, 8, 16]),
            rng.choice("abc"),
        )
        for i in range(n)
    ]


class LeaseChecker:
    """Replays the lease records: a GPU is never held twice, a gang never spans domains."""

    def __init__(self, fleet: Fleet):
        self.domain = {n.name: n.domain_key for n in fleet.nodes}
        self.held: dict[tuple[str, int], str] = {}
        self.starts = 0

    def __call__(self, record: LeaseRecord) -> None:
        p = record.placement
        gpus = [(s.node, g) for s in p.slices for g in s.gpu_indices]
        if record.kind == "start":
            self.starts += 1
            assert {self.domain[s.node] for s in p.slices} == {(p.site, p.cluster, p.domain)}
            for key in gpus:
                assert key not in self.held, f"{key} leased to {self.held.get(key)} and {record.attempt_id}"
                self.held[key] = record.attempt_id
        else:
            for key in gpus:
                assert self.held.pop(key) == record.attempt_id


@pytest.mark.parametrize("policy", sorted(POLICY_NAMES))
def test_every_policy_completes_every_job_with_exclusive_leases_in_one_domain(policy: str) -> None:
    fleet = standard_fleet(nodes=8, preemptible_nodes=4)  # two domains of 4 nodes, one of them spot
    trace = mixed_trace()
    checker = LeaseChecker(fleet)
    config = SimConfig(preemptible_mtbi_s=4 * 3600.0, seed=3)
    result = simulate(trace, fleet, policy, config, observer=checker)
    assert sorted(j.id for j in result.jobs) == sorted(j.id for j in trace)
    assert checker.starts >= len(trace)
    assert not checker.held  # everything given back
    for done in result.jobs:
        assert done.finished_s >= done.submitted_s + done.duration_s
    summary = summarize(result)
    assert summary.goodput is not None and 0 < summary.goodput <= 1 and 0 < summary.utilization <= 1


def test_interruption_loses_only_progress_since_the_last_checkpoint() -> None:
    fleet = standard_fleet(nodes=1, nodes_per_domain=1, preemptible_nodes=1)
    config = SimConfig(
        checkpoint_cost_s=30.0,
        restore_s=60.0,
        checkpoint_interval=1000.0,
        preemptible_mtbi_s=None,
        node_down_s=600.0,
        interruptions=((2500.0, "n0000"),),
    )
    result = simulate([job(0, 0.0, 10_000.0, 1)], fleet, "fifo", config)
    (done,) = result.jobs
    lost, resumed = result.attempts
    # Checkpoints complete at 1030 and 2060 (2,000 s saved); at 2500 it had done 2,440 s: 440 s lost,
    # and it had paused 60 s to write the two.
    assert lost.outcome == "LOST" and not lost.resumed
    assert lost.lost_s == pytest.approx(440.0) and lost.stall_s == pytest.approx(60.0) and lost.restore_s == 0
    # Back at 3100 (node down 600 s), restore 60 s, 8,000 s of work left with 7 checkpoints of 30 s.
    assert done.finished_s == pytest.approx(3100.0 + 60.0 + 8000.0 + 7 * 30.0)
    assert resumed.outcome == "SUCCEEDED" and resumed.resumed and resumed.made_step
    assert resumed.restore_s == 60.0 and resumed.stall_s == pytest.approx(7 * 30.0) and resumed.lost_s == 0
    summary = summarize(result)
    assert summary.lost_gpu_h == pytest.approx(440.0 / 3600)
    assert done.attempts == 2 and summary.resumes == 1 and summary.resume_success == 1.0
    # Useful: the job's 10,000 s of work, once (2,000 s kept by the first attempt, the rest by the second).
    assert summary.useful_gpu_h == pytest.approx(10_000.0 / 3600)
    assert summary.goodput == pytest.approx(10_000.0 / (2500.0 + 60.0 + 8000.0 + 7 * 30.0))


def test_preemption_checkpoints_then_requeues_without_losing_progress() -> None:
    fleet = standard_fleet(nodes=1, nodes_per_domain=1, preemptible_nodes=0)
    trace = [job(0, 0.0, 50_000.0, 8), job(1, 10_000.0, 600.0, 8)]
    config = SimConfig(preemptible_mtbi_s=None, checkpoint_interval=3600.0)
    result = simulate(trace, fleet, "tiresias", config)
    long, short = sorted(result.jobs, key=lambda j: j.id)
    assert result.totals.preemptions == 1 and summarize(result).lost_gpu_h == 0
    # Stopped at 10,000 s with 9,940 s done: two periodic checkpoints and the stop's, 30 s each.
    stopped = next(a for a in result.attempts if a.job_id == long.id)
    assert stopped.outcome == "PREEMPTED" and stopped.lost_s == 0 and stopped.stall_s == pytest.approx(90.0)
    # The short job waits only for the long one's stop checkpoint (30 s), then runs.
    assert short.finished_s == pytest.approx(10_000.0 + 30.0 + 600.0)
    assert long.attempts == 2
    # Work, periodic checkpoints, the stop checkpoint, the wait, the restore.
    assert long.finished_s > 50_000.0 + 600.0 + 60.0


def test_oracle_sjf_reads_true_durations_and_exists_in_the_simulator_only() -> None:
    fleet = standard_fleet(nodes=1, nodes_per_domain=1, preemptible_nodes=0)
    trace = [job(0, 0.0, 1000.0, 8), job(1, 10.0, 10_000.0, 8), job(2, 20.0, 100.0, 8)]
    config = SimConfig(preemptible_mtbi_s=None)
    order = {
        name: [j.id for j in sorted(simulate(trace, fleet, name, config).jobs, key=lambda j: j.finished_s)]
        for name in ("fifo-backfill", "oracle-sjf")
    }
    assert order["fifo-backfill"] == ["j0000", "j0001", "j0002"]
    assert order["oracle-sjf"] == ["j0000", "j0002", "j0001"]  # the short one, known to be short
    assert "oracle-sjf" not in POLICIES  # the service's policies never read durations


def test_same_seed_same_run_and_interruptions_happen() -> None:
    fleet = standard_fleet(nodes=8)
    config = SimConfig(preemptible_mtbi_s=2 * 3600.0, seed=7)
    one = summarize(simulate(mixed_trace(80), fleet, "gpuyard", config))
    two = summarize(simulate(mixed_trace(80), fleet, "gpuyard", config))
    assert one == two
    assert one.interruptions > 0 and one.lost_gpu_h > 0
    reseeded = SimConfig(preemptible_mtbi_s=7200.0, seed=8)
    other = summarize(simulate(mixed_trace(80), fleet, "gpuyard", reseeded))
    assert other.interruptions != one.interruptions or other.avg_jct_h != one.avg_jct_h


def test_gang_too_big_for_any_domain_is_rejected_not_waited_for() -> None:
    fleet = standard_fleet(nodes=8)  # domains of 32 GPUs
    result = simulate([job(0, 0.0, 100.0, 64), job(1, 0.0, 100.0, 1)], fleet, "fifo")
    assert [j.id for j in result.jobs] == ["j0001"]
    assert result.rejected[0][0] == "j0000" and "no domain" in result.rejected[0][1]


def test_quotas_add_up_to_the_fleet_in_one_cohort(tmp_path: Path) -> None:
    fleet = standard_fleet(nodes=8)
    quotas = derive_quotas(mixed_trace(), fleet)
    assert sum(q.gpu_quota for q in quotas.values()) == 64
    assert {q.cohort for q in quotas.values()} == {"trace"}
    write_fleet(fleet, tmp_path / "fleet.yaml")
    assert load_fleet(tmp_path / "fleet.yaml") == fleet
    assert jain_index([1.0, 1.0]) == 1.0 and jain_index([1.0, 0.0]) == pytest.approx(0.5)


# -- the trace file and the CLI -----------------------------------------------------------------


HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"


def write_trace(path: Path, rows: list[str], header: str = HEADER) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


ROWS = [
    "2017-10-01 00:00:00,600.0,1,600.0,team1",
    "2017-10-01 00:01:00,3600.0,8,28800.0,team2",
    "2017-10-01 00:02:00,120.0,2,240.0,team1",
    "2017-10-02 00:00:00,120.0,1,120.0,team3",
]


def test_read_trace_window_and_bad_rows(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.csv", ROWS)
    jobs = read_trace(path, T0, T0 + timedelta(days=1), min_duration_s=100)
    assert [(j.team, j.gpus, j.duration_s) for j in jobs] == [
        ("team1", 1, 600.0),
        ("team2", 8, 3600.0),
        ("team1", 2, 120.0),
    ]
    bad = write_trace(tmp_path / "bad.csv", [*ROWS[:2], "2017-10-01 00:03:00,60,two,120,team1"])
    with pytest.raises(TraceError, match=r"row 4, column 'num_gpus'.*'two'"):
        read_trace(bad)
    bad = write_trace(tmp_path / "bad2.csv", ["2017-13-01 00:00:00,60,1,60,t"])
    with pytest.raises(TraceError, match=r"row 2, column 'timestamp'"):
        read_trace(bad)
    missing = write_trace(tmp_path / "missing.csv", ["2017-10-01 00:00:00,60,t"], "timestamp,duration,x")
    with pytest.raises(TraceError, match=r"missing column\(s\) \['num_gpus', 'cluster'\]"):
        read_trace(missing)


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(sim)
    return app


def test_cli_prints_a_table_and_json(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", ROWS)
    fleet = tmp_path / "fleet.yaml"
    write_fleet(standard_fleet(nodes=8), fleet)
    runner = CliRunner()
    args = ["--trace", str(trace), "--fleet", str(fleet), "--start", "2017-10-01", "--end", "2017-10-03"]
    shown = runner.invoke(cli(), [*args, "--policy", "fifo,gpuyard"])
    assert shown.exit_code == 0, shown.output
    assert "avg JCT h" in shown.output and "gpuyard" in shown.output and "fifo" in shown.output
    as_json = runner.invoke(cli(), [*args, "--policy", "tiresias", "--json"])
    assert as_json.exit_code == 0, as_json.output
    (figures,) = json.loads(as_json.output)
    assert figures["policy"] == "tiresias" and figures["jobs"] == 4
    for key in (
        "avg_jct_h",
        "p50_jct_h",
        "p99_jct_h",
        "avg_wait_h",
        "p99_wait_h",
        "utilization",
        "goodput",
        "lost_gpu_h",
        "resume_success",
        "cost_usd",
        "jain",
        "makespan_h",
    ):
        assert key in figures


def test_cli_names_the_bad_row_and_column(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", [ROWS[0], "2017-10-01 00:01:00,-5,1,0,team2"])
    result = CliRunner().invoke(cli(), ["--trace", str(trace), "--policy", "fifo"])
    assert result.exit_code == 2
    assert "row 3, column 'duration'" in result.output
    unknown = CliRunner().invoke(cli(), ["--trace", str(trace), "--policy", "lottery"])
    assert unknown.exit_code == 2 and "unknown policy 'lottery'" in unknown.output
    backwards = CliRunner().invoke(cli(), ["--trace", str(trace), "--policy", "fifo", "--cycle-period", "-1"])
    assert backwards.exit_code == 2 and "--cycle-period" in backwards.output


# -- property: random small traces ---------------------------------------------------------------

traces = st.lists(
    st.tuples(
        st.floats(0, 4000, allow_nan=False),
        st.floats(1, 6000, allow_nan=False),
        st.sampled_from([1, 1, 2, 3, 4, 8, 12, 16]),
        st.sampled_from(["a", "b"]),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=traces, policy=st.sampled_from(sorted(POLICIES)), seed=st.integers(0, 1000))
def test_property_no_gpu_leased_twice_and_gangs_stay_in_one_domain(
    rows: list[tuple[float, float, int, str]], policy: str, seed: int
) -> None:
    fleet = standard_fleet(nodes=6, nodes_per_domain=3, preemptible_nodes=3)
    trace = [job(i, at, dur, gpus, team) for i, (at, dur, gpus, team) in enumerate(rows)]
    checker = LeaseChecker(fleet)
    config = SimConfig(preemptible_mtbi_s=1800.0, node_down_s=300.0, seed=seed)
    result = simulate(trace, fleet, policy, config, observer=checker)
    assert len(result.jobs) == len(trace) and not checker.held


class InstantChecker(LeaseChecker):
    """Also: no attempt ends at the instant it started (an eviction ping-pong would)."""

    def __init__(self, fleet: Fleet):
        super().__init__(fleet)
        self.started: dict[str, float] = {}

    def __call__(self, record: LeaseRecord) -> None:
        super().__call__(record)
        if record.kind == "start":
            self.started[record.attempt_id] = record.at_s
        else:
            assert record.at_s > self.started[record.attempt_id], f"{record.attempt_id} evicted at once"


def contended_scenario(seed: int) -> tuple[list[TraceJob], Fleet, dict[str, TeamQuota], SimConfig]:
    """A small fleet shared by four teams with random quotas in one cohort, bursts of jobs at the
    same instants, free or paid checkpoints: teams borrow, reclaim and share borrowed GPUs."""
    rng = random.Random(seed)
    rows = [
        (
            rng.choice([0, 0, 100, 200, 300, 3600, 7200, 7300]) + rng.choice([0, 0, 50]),
            rng.uniform(60, 30_000),
            rng.choice([1, 1, 1, 2, 4, 8, 8, 16]),
            rng.choice("aabcd"),
        )
        for _ in range(rng.randint(5, 60))
    ]
    fleet = standard_fleet(
        nodes=rng.choice([4, 6, 8]), nodes_per_domain=2, preemptible_nodes=rng.choice([0, 2])
    )
    capacity = sum(n.gpus for n in fleet.nodes)
    shares = [rng.randint(1, capacity // 3) for _ in "abc"]
    quotas = {
        team: TeamQuota(gpu_quota=quota, cohort="all")
        for team, quota in zip("abcd", [*shares, max(1, capacity - sum(shares))], strict=True)
    }
    config = SimConfig(
        checkpoint_cost_s=rng.choice([0.0, 30.0]),
        restore_s=rng.choice([0.0, 60.0]),
        preemptible_mtbi_s=rng.choice([None, 3600.0]),
        seed=seed,
    )
    return [job(i, *row) for i, row in enumerate(rows)], fleet, quotas, config


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), policy=st.sampled_from(["gpuyard", "kueue", "tiresias"]))
def test_property_no_eviction_ping_pong_within_one_instant(seed: int, policy: str) -> None:
    """A just-placed attempt has nothing unsaved, so its stop is immediate: two rules that evicted
    each other would loop at one instant. Fair-share rules (reclaim, least attained service, sharing
    borrowed GPUs) spare attempts younger than MIN_RUN_S and priority evictions only go up a class,
    so no attempt is ever evicted at the instant it started. (With MIN_RUN_S = 0 this fails.)"""
    trace, fleet, quotas, config = contended_scenario(seed)
    checker = InstantChecker(fleet)
    result = simulate(trace, fleet, policy, config, quotas=quotas, observer=checker)
    assert len(result.jobs) == len(trace) and not checker.held


def test_a_long_job_under_a_stream_of_short_jobs_finishes_within_its_starvation_bound() -> None:
    # One node of 8 GPUs, one team owning them. A 10,000 s job on all 8 GPUs, then for 90,000 s a
    # stream of 1-GPU jobs of 1,500 s, 6 every 1,500 s: 6 GPUs always busy with less-served work, so
    # under 2D-LAS alone the long job waits for the stream to end; with the guard its JCT stays
    # within factor x its run (the load, 86%, leaves room for every job's bound).
    fleet = standard_fleet(nodes=1, nodes_per_domain=1, preemptible_nodes=0)
    quotas = {"a": TeamQuota(gpu_quota=8)}
    stream = [job(1 + i, 100.0 + 1500.0 * (i // 6), 1500.0, 1) for i in range(6 * 60)]
    trace = [job(0, 0.0, 10_000.0, 8), *stream]
    config = SimConfig(preemptible_mtbi_s=None)
    guard = StarvationGuard(factor=3.0, floor_s=600.0)
    guarded = replace(POLICIES["gpuyard"], starvation=guard)
    unguarded = replace(
        guarded, starvation=None, preemption=tuple(r for r in guarded.preemption if r != "starvation")
    )
    for policy, bounded in ((guarded, True), (unguarded, False)):
        result = simulate(trace, fleet, policy, config, quotas=quotas)
        long = next(j for j in result.jobs if j.id == "j0000")
        assert len(result.jobs) == len(trace)
        if bounded:
            # its run includes the restores, periodic and stop checkpoints (one per attempt at most)
            overheads = long.attempts * (config.restore_s + config.checkpoint_cost_s)
            run_s = long.duration_s + overheads + config.checkpoint_cost_s * long.duration_s / 3600
            bound_s = guard.factor * (run_s + guard.floor_s) + MIN_RUN_S + config.checkpoint_cost_s
            assert long.jct_s <= bound_s, long
            assert long.attempts > 1  # it was preempted, and came back in time
        else:
            assert long.jct_s > 85_000.0  # starved until the stream ended
