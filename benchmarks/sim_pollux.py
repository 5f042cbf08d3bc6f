"""Replay the Pollux (OSDI'21) study's workloads under its Tiresias baseline and gpuyard's elastic sizing.

The study's job model (`gpuyard.sim.elastic`): elastic jobs whose step and sync time come from the
measured placements and whose progress per step is the statistical-efficiency gain at their batch;
16 nodes x 4 GPUs, scheduling every 60 s, a 30 s restart on every (re)allocation. The baseline is the
study's Tiresias (two queues, one threshold of 16 GPU-hours), each job at its tuned size (the
workload's num_replicas and batch_size). The published average JCTs at job load 1.0 (traces/README.md,
"Elastic scheduling") are printed beside each workload's. gpuyard (`sim/elastic/sizing.py`) sizes
every job each interval from its fitted goodput, its batch adaptive (`gpuyard`) or at the tuned one
(`gpuyard-fixed-batch`); Pollux's published mean on workloads 1-4 is 0.717 h.

    .venv/bin/python benchmarks/sim_pollux.py [--workload FILE ...] [--applications DIR] [--chart PNG]
        [--delayed-copies SEED ...]

Prints one line per workload and policy, progress on stderr, and
`RESULT gpuyard_avg_jct_h=G gpuyard_fixed_batch_avg_jct_h=F tiresias_avg_jct_h=T`: for each policy the
mean over the workloads of each one's average JCT, hours; writes a chart (average JCT by workload
against the published figures, the CDF of JCT, the GPUs held). One replay of a workload is chaotic (a
policy's change moves single workloads 5-10% either way): `--delayed-copies 1 2 3` also replays copies
of each workload with every submission delayed 0-180 s at random (by seed), and prints each
policy's mean over the copies, the figure to judge a change of policy by.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuyard.sim.charts import ElasticRun, write_elastic_chart
from gpuyard.sim.elastic.jobs import ElasticJob, Submission, read_workload
from gpuyard.sim.elastic.profiles import load_applications
from gpuyard.sim.elastic.replay import GPUS_PER_NODE, INTERVAL_S, NODES, RESTART_S, jcts, replay

ROOT = Path(__file__).resolve().parents[1]
POLLUX = ROOT.parent / "shared" / "traces" / "pollux"
WORKLOADS = [POLLUX / "workloads" / f"workload-{i}.csv" for i in range(1, 5)]
# traces/README.md "Elastic scheduling": Tiresias (tuned jobs), average JCT at job load 1.0, hours
PUBLISHED_H = {
    "workload-1.csv": 0.687,
    "workload-2.csv": 1.429,
    "workload-3.csv": 1.077,
    "workload-4.csv": 0.911,
}
GATE = 0.15  # the mean within 15% of the published mean
POLLUX_PUBLISHED_MEAN_H = 0.717  # traces/README.md: Pollux, mean of workloads 1-4
POLICIES = ("tiresias", "gpuyard", "gpuyard-fixed-batch")
PROGRESS_EVERY_S = 4 * 3600  # of simulated time
POLLUX_PUBLISHED_H = {  # traces/README.md: Pollux, average JCT at job load 1.0, hours
    "workload-1.csv": 0.580,
    "workload-2.csv": 0.923,
    "workload-3.csv": 0.608,
    "workload-4.csv": 0.756,
}
MAX_DELAY_S = 180  # of a delayed copy's submissions


def compared(value_h: float, published_h: float | None) -> str:
    if published_h is None:
        return "no published value"
    return f"published {published_h:.3f} h, gap {value_h / published_h - 1:+.1%}"


def reporter(workload: str, held: list[float]) -> Callable[[int, Sequence[ElasticJob]], None]:
    """Progress on stderr every PROGRESS_EVERY_S of simulated time; the share of the cluster's GPUs
    held at each interval with active jobs appended to `held`."""

    def report(now_s: int, active: Sequence[ElasticJob]) -> None:
        held.append(sum(sum(job.placement) for job in active) / (NODES * GPUS_PER_NODE))
        if now_s % PROGRESS_EVERY_S == 0:
            print(f"  {workload}: {now_s / 3600:g} h simulated, {len(active)} jobs active", file=sys.stderr)

    return report


def delayed(submissions: Sequence[Submission], seed: int) -> list[Submission]:
    """A copy of a workload with each submission delayed 0-MAX_DELAY_S at random."""
    rng = random.Random(seed)
    return [
        dataclasses.replace(s, submitted_s=s.submitted_s + rng.uniform(0, MAX_DELAY_S)) for s in submissions
    ]


def average_jct_h(by_job: Mapping[str, float]) -> float:
    """The mean of the jobs' completion times (seconds, by job), hours."""
    return sum(by_job.values()) / len(by_job) / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, action="append", help="repeatable; default: workloads 1-4")
    parser.add_argument("--applications", type=Path, default=POLLUX / "applications")
    parser.add_argument("--chart", type=Path, default=Path(".gpuyard/sim/sim_pollux.png"), help="PNG written")
    parser.add_argument("--delayed-copies", type=int, nargs="*", default=[], metavar="SEED")
    args = parser.parse_args()
    workloads: list[Path] = args.workload or WORKLOADS

    apps = load_applications(args.applications)
    print(
        f"applications {args.applications}: {', '.join(apps)}; {NODES} nodes x {GPUS_PER_NODE} GPUs, "
        f"interval {INTERVAL_S} s, restart {RESTART_S} s; policies {', '.join(POLICIES)} "
        "(tiresias: jobs at their tuned size)",
        flush=True,
    )
    averages: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    runs: list[ElasticRun] = []
    for path in workloads:
        submissions = read_workload(path, apps)
        for policy in POLICIES:
            started = time.perf_counter()
            held: list[float] = []
            jobs = replay(submissions, apps, policy, on_interval=reporter(f"{path.name} {policy}", held))
            by_job = jcts(jobs)
            average_h = average_jct_h(by_job)
            averages[policy].append(average_h)
            runs.append(
                ElasticRun(path.name, policy, [s / 3600 for s in by_job.values()], sum(held) / len(held))
            )
            wall = time.perf_counter() - started
            published = (
                f" ({compared(average_h, PUBLISHED_H.get(path.name))})" if policy == "tiresias" else ""
            )
            restarts = sum(job.allocations for job in jobs)
            print(
                f"{path.name}: {len(jobs)} jobs, {policy} avg JCT {average_h:.3f} h{published}; "
                f"{restarts} (re)starts; {wall:.1f} s wall",
                flush=True,
            )
    means = {policy: sum(values) / len(values) for policy, values in averages.items()}
    names = [path.name for path in workloads]
    if all(name in PUBLISHED_H for name in names):
        published_h = sum(PUBLISHED_H[name] for name in names) / len(names)
        tiresias_h = means["tiresias"]
        met = abs(tiresias_h / published_h - 1) <= GATE
        print(
            f"mean over {len(names)} workloads: {tiresias_h:.3f} h ({compared(tiresias_h, published_h)}; "
            f"gate within {GATE:.0%}: {'met' if met else 'MISSED'})"
        )
    if sorted(names) == sorted(PUBLISHED_H):
        for policy in ("gpuyard", "gpuyard-fixed-batch"):
            print(
                f"{policy}: mean {means[policy]:.3f} h (Pollux published {POLLUX_PUBLISHED_MEAN_H:.3f} h, "
                f"gap {means[policy] / POLLUX_PUBLISHED_MEAN_H - 1:+.1%})"
            )
    for seed in args.delayed_copies:
        copies: dict[str, list[float]] = {p: [] for p in POLICIES}
        for path in workloads:
            submissions = delayed(read_workload(path, apps), seed)
            for p, averages_h in copies.items():
                averages_h.append(average_jct_h(jcts(replay(submissions, apps, p))))
        print(
            f"copies delayed by seed {seed}: "
            + ", ".join(f"{p} mean {sum(v) / len(v):.3f} h" for p, v in copies.items()),
            flush=True,
        )
    published = {
        name: {"Tiresias": PUBLISHED_H[name], "Pollux": POLLUX_PUBLISHED_H[name]}
        for name in names
        if name in PUBLISHED_H
    }
    title = f"Pollux workloads on {NODES} nodes x {GPUS_PER_NODE} GPUs"
    print("chart:", write_elastic_chart(runs, published, args.chart, title))
    print(
        f"RESULT gpuyard_avg_jct_h={means['gpuyard']:.3f} "
        f"gpuyard_fixed_batch_avg_jct_h={means['gpuyard-fixed-batch']:.3f} "
        f"tiresias_avg_jct_h={means['tiresias']:.3f}"
    )


if __name__ == "__main__":
    main()
