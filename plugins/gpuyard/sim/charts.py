"""The simulator's pictures: one PNG per run (matplotlib, Agg), beside its table; the Pollux replay's
(`write_elastic_chart`: average JCT by workload against the published figures, the CDF of JCT, the
GPUs held) and the weeks' grid of ratios (`write_ratio_grid`) have their own.

Four panels, one line or bar group per policy: the CDF of job completion time; the queue length over
time; GPU utilization over time; the mean time pending by team (the busiest teams; the first
wait and every wait after a preemption). Queue length and
utilization come from the leases the engine reports to an observer (`Recorder`): a job waits while
it is submitted, unfinished and holds no lease (so a preempted job waits again), and utilization is
the leased GPUs over the fleet's. Without a recording, both are derived from the per-job results
(waiting from submission to first start, holding its GPUs from first start to finish) and the panel
says so.

    recorder = Recorder()
    result = simulate(jobs, fleet, "gpuyard", config, observer=recorder.record)
    write_chart([(result, recorder)], Path("run.png"), title="philly dev week")
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from gpuyard.domain.fleet import Fleet
from gpuyard.sim.engine import LeaseRecord, SimConfig, SimResult
from gpuyard.sim.metrics import Summary, summarize
from gpuyard.sim.run import simulate
from gpuyard.sim.trace import TraceJob

POINTS = 400  # samples of the curves over time
TEAMS = 12  # the busiest teams in the wait panel


@dataclass
class Recorder:
    """Collects the engine's lease records (its `observer`): what the time panels are drawn from."""

    leases: list[tuple[float, int, str]] = field(default_factory=list)  # (at s, +/- GPUs, job id)

    def record(self, lease: LeaseRecord) -> None:
        sign = 1 if lease.kind == "start" else -1
        self.leases.append((lease.at_s, sign * lease.placement.gpus, lease.job_id))


@dataclass(frozen=True)
class RecordedRun:
    """One policy's replay, its leases recorded: a line of the chart and a row of the table."""

    result: SimResult
    recorder: Recorder
    summary: Summary
    wall_s: float  # simulating and summarizing


def run_recorded(
    trace: list[TraceJob],
    fleet: Fleet,
    policy: str,
    config: SimConfig,
    *,
    quota_rule: str = "share",
    progress: bool = False,
) -> RecordedRun:
    """`simulate` under `policy` with a Recorder as its observer, summarized and timed."""
    began = time.perf_counter()
    recorder = Recorder()
    result = simulate(
        trace, fleet, policy, config, quota_rule=quota_rule, progress=progress, observer=recorder.record
    )
    summary = summarize(result)
    return RecordedRun(result, recorder, summary, time.perf_counter() - began)


def _steps(events: list[tuple[float, float]], times: list[float]) -> list[float]:
    """The running sum of (time, delta) events, sampled at `times` (both ascending)."""
    events = sorted(events)
    out, total, i = [], 0.0, 0
    for t in times:
        while i < len(events) and events[i][0] <= t:
            total += events[i][1]
            i += 1
        out.append(total)
    return out


def over_time(
    result: SimResult, recorder: Recorder | None
) -> tuple[list[float], list[float], list[float], bool]:
    """(hours, waiting jobs, utilization, exact) sampled from the first to the last submit; `exact`
    when drawn from the leases."""
    end = max(result.last_submit_s, 1.0)  # the submit window, where the load is (as the table's util)
    times = [end * k / (POINTS - 1) for k in range(POINTS)]
    arrivals = [(j.submitted_s, 1.0) for j in result.jobs] + [(j.finished_s, -1.0) for j in result.jobs]
    if recorder is not None and recorder.leases:
        held: dict[str, int] = {}
        running: list[tuple[float, float]] = []
        for at, gpus, job in sorted(recorder.leases, key=lambda x: (x[0], -x[1])):
            before = held.get(job, 0)
            held[job] = before + (1 if gpus > 0 else -1)
            if before == 0 and held[job] == 1:
                running.append((at, 1.0))
            elif before == 1 and held[job] == 0:
                running.append((at, -1.0))
        leased = [(at, float(gpus)) for at, gpus, _ in recorder.leases]
        exact = True
    else:
        running = [(j.first_start_s, 1.0) for j in result.jobs] + [(j.finished_s, -1.0) for j in result.jobs]
        leased = [(j.first_start_s, float(j.gpus)) for j in result.jobs] + [
            (j.finished_s, -float(j.gpus)) for j in result.jobs
        ]
        exact = False
    present, busy, gpus = _steps(arrivals, times), _steps(running, times), _steps(leased, times)
    waiting = [max(0.0, p - b) for p, b in zip(present, busy, strict=True)]
    utilization = [g / max(1, result.capacity_gpus) for g in gpus]
    return [t / 3600.0 for t in times], waiting, utilization, exact


def write_chart(runs: Sequence[tuple[SimResult, Recorder | None]], path: Path, title: str) -> Path:
    """One PNG of the runs (one per policy, same trace and fleet) at `path`; returns the path."""
    if not runs:
        raise ValueError("write_chart needs at least one simulation result")
    figure, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    jct, queue, util, waits = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    exact_all = True
    for result, recorder in runs:
        hours = sorted(j.jct_s / 3600.0 for j in result.jobs)
        if hours:
            jct.plot(hours, [(k + 1) / len(hours) for k in range(len(hours))], label=result.policy)
        t, waiting, utilization, exact = over_time(result, recorder)
        exact_all &= exact
        queue.plot(t, waiting, label=result.policy, linewidth=1)
        util.plot(t, utilization, label=result.policy, linewidth=1)
    jct.set(xscale="log", xlabel="job completion time (h, log)", ylabel="share of jobs", title="CDF of JCT")
    note = "" if exact_all else " (from first start to finish)"
    queue.set(xlabel="hours, first to last submit", ylabel="jobs waiting", title=f"queue length{note}")
    util.set(xlabel="hours, first to last submit", ylabel="GPUs leased / fleet", title=f"utilization{note}")
    util.set_ylim(0, 1.05)
    _waits_by_team(waits, [result for result, _ in runs])
    for ax in (jct, queue, util):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    first = runs[0][0]
    figure.suptitle(f"{title}: {len(first.jobs)} jobs on {first.capacity_gpus} GPUs")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _waits_by_team(ax: plt.Axes, results: list[SimResult]) -> None:
    counts: dict[str, int] = {}
    for job in results[0].jobs:
        counts[job.team] = counts.get(job.team, 0) + 1
    teams = sorted(counts, key=lambda t: (-counts[t], t))[:TEAMS]
    width = 0.8 / len(results)
    for k, result in enumerate(results):
        per_team: dict[str, list[float]] = {}
        for job in result.jobs:
            per_team.setdefault(job.team, []).append(job.pending_s / 3600.0)
        means = [sum(per_team.get(t, [0.0])) / max(1, len(per_team.get(t, []))) for t in teams]
        ax.bar([i + k * width for i in range(len(teams))], means, width, label=result.policy)
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(teams))], teams, rotation=45, ha="right", fontsize=7
    )
    ax.set(
        ylabel="mean time pending (h)", title=f"wait by team, requeues included (the {len(teams)} busiest)"
    )
    top = max((p.get_height() for p in ax.patches), default=0.0)
    if top > 0 and math.isfinite(top):
        ax.set_ylim(0, top * 1.1)
    ax.legend(fontsize=8)


@dataclass(frozen=True)
class ElasticRun:
    """One policy's replay of one workload in the Pollux replay (sim/elastic): a bar and a curve."""

    workload: str
    policy: str
    jct_h: Sequence[float]  # each job's completion time, hours
    busy: float  # GPUs held over the cluster's, averaged over the intervals with active jobs


def write_elastic_chart(
    runs: Sequence[ElasticRun], published_h: dict[str, dict[str, float]], path: Path, title: str
) -> Path:
    """One PNG of the Pollux replay at `path`: the average JCT of each workload by policy, with the
    published figures (`published_h`: per workload, per name) as markers; the CDF of JCT over all
    workloads by policy; the GPUs held by workload and policy. Returns the path."""
    if not runs:
        raise ValueError("write_elastic_chart needs at least one replay")
    workloads = list(dict.fromkeys(run.workload for run in runs))
    policies = list(dict.fromkeys(run.policy for run in runs))
    by = {(run.workload, run.policy): run for run in runs}
    figure, (bars, cdf, busy) = plt.subplots(1, 3, figsize=(16, 5))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        xs = [i + k * width for i in range(len(workloads))]
        found = [by.get((w, policy)) for w in workloads]
        bars.bar(
            xs, [sum(r.jct_h) / len(r.jct_h) if r and r.jct_h else 0.0 for r in found], width, label=policy
        )
        busy.bar(xs, [r.busy if r else 0.0 for r in found], width, label=policy)
        hours = sorted(h for r in found if r for h in r.jct_h)
        if hours:
            cdf.plot(hours, [(i + 1) / len(hours) for i in range(len(hours))], label=policy)
    names = sorted({name for figures in published_h.values() for name in figures})
    for name, marker in zip(names, "ovsD^", strict=False):
        points = [
            (i + 0.4 - width / 2, published_h[w][name])
            for i, w in enumerate(workloads)
            if name in published_h.get(w, {})
        ]
        if points:
            bars.scatter(
                *zip(*points, strict=True), marker=marker, color="black", zorder=3, label=f"{name}, published"
            )
    for ax in (bars, busy):
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(workloads))], workloads, rotation=20, fontsize=8
        )
    bars.set(ylabel="average JCT (h)", title="average JCT by workload")
    cdf.set(
        xscale="log",
        xlabel="job completion time (h, log)",
        ylabel="share of jobs",
        title="CDF of JCT, all workloads",
    )
    busy.set(ylabel="GPUs held / cluster", title="GPUs held while jobs are active")
    busy.set_ylim(0, 1.05)
    for ax in (bars, cdf, busy):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_ratio_grid(
    rows: Sequence[str], columns: Sequence[str], ratios: Sequence[Sequence[float]], path: Path, title: str
) -> Path:
    """A grid of ratios (lower is better, 1 is even), one cell per row x column, each labelled with its
    value: green below 1, red above. Returns the path of the PNG."""
    if not rows or not columns:
        raise ValueError("write_ratio_grid needs at least one row and one column")
    figure, ax = plt.subplots(figsize=(1.6 * len(columns) + 2.5, 0.45 * len(rows) + 1.8))
    worst = max(0.05, max(abs(math.log(max(r, 1e-9))) for row in ratios for r in row if math.isfinite(r)))
    image = ax.imshow(
        [[math.log(max(r, 1e-9)) if math.isfinite(r) else worst for r in row] for row in ratios],
        cmap="RdYlGn_r",
        vmin=-worst,
        vmax=worst,
        aspect="auto",
    )
    for i, row in enumerate(ratios):
        for j, value in enumerate(row):
            ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_title(title, fontsize=10)
    figure.colorbar(image, ax=ax, label="log ratio")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
