"""Replay the Pollux (OSDI'21) study's workloads under its Tiresias baseline and gpuyard's elastic sizing.

The study's job model (`gpuyard.sim.elastic`): elastic jobs whose step and sync time come from the
measured placements and whose progress per step is the statistical-efficiency gain at their batch;
16 nodes x 4 GPUs, scheduling every 60 s, a 30 s restart on every (re)allocation. The baseline is the
study's Tiresias (two queues, one threshold of 16 GPU-hours), each job at its tuned size (the
workload's num_replicas and batch_size). The published average JCTs at job load 1.0 (traces/README.md,
"Elastic scheduling") are printed beside each workload's. gpuyard (`sim/elastic/sizing.py`) sizes
every job each interval from its fitted goodput, its batch adaptive (`gpuyard`) or at the tuned one
(`gpuyard-fixed-batch`); Pollux's published mean on workloads 1-4 is 0.717 h.

    .venv/bin/python benchmarks/sim_pollux.py [--workload FILE ...] [--applications DIR]

Prints one line per workload and policy, progress on stderr, and
`RESULT gpuyard_avg_jct_h=G gpuyard_fixed_batch_avg_jct_h=F tiresias_avg_jct_h=T`: for each policy the
mean over the workloads of each one's average JCT, hours.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuyard.sim.elastic.jobs import ElasticJob, read_workload
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


def compared(value_h: float, published_h: float | None) -> str:
    if published_h is None:
        return "no published value"
    return f"published {published_h:.3f} h, gap {value_h / published_h - 1:+.1%}"


def reporter(workload: str) -> Callable[[int, Sequence[ElasticJob]], None]:
    """Progress on stderr every PROGRESS_EVERY_S of simulated time."""

    def report(now_s: int, active: Sequence[ElasticJob]) -> None:
        if now_s % PROGRESS_EVERY_S == 0:
            print(f"  {workload}: {now_s / 3600:g} h simulated, {len(active)} jobs active", file=sys.stderr)

    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, action="append", help="repeatable; default: workloads 1-4")
    parser.add_argument("--applications", type=Path, default=POLLUX / "applications")
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
    for path in workloads:
        submissions = read_workload(path, apps)
        for policy in POLICIES:
            started = time.perf_counter()
            jobs = replay(submissions, apps, policy, on_interval=reporter(f"{path.name} {policy}"))
            by_job = jcts(jobs)
            average_h = sum(by_job.values()) / len(by_job) / 3600
            averages[policy].append(average_h)
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
    print(
        f"RESULT gpuyard_avg_jct_h={means['gpuyard']:.3f} "
        f"gpuyard_fixed_batch_avg_jct_h={means['gpuyard-fixed-batch']:.3f} "
        f"tiresias_avg_jct_h={means['tiresias']:.3f}"
    )


if __name__ == "__main__":
    main()
