"""The workload mix of the public traces the simulator reads: how many jobs ask one GPU, how much of the
GPU time gangs hold, and how long jobs run.

Each trace is read by the simulator's own readers (`gpuyard.sim.trace.read_trace` for the Philly
format, `gpuyard.sim.openb.read_pods` for the Alibaba OpenB pods), so the jobs counted here are the
jobs a replay would see. Per trace: the jobs, the share of 1-GPU jobs, the share of GPU time (run time
x GPUs) held by jobs of more than 1 GPU and of more than 8, and the run time's p50, p90 and p99 (nearest
rank, `gpuyard.domain.accounting.percentile`, as every percentile of the platform). The size classes
are the simulator's (`sim.metrics.SIZE_CLASSES`).

Three sets by default: the whole Philly file (every row, as `gpuyard sim` reads it without a window),
the Philly dev week the simulator benchmarks replay (2017-10-01..08, jobs of at least 60 s), and the
OpenB pods asking GPUs (a fractional request counts its share of one GPU; pods without GPUs or never
scheduled are left out, as `read_pods` leaves them). The traces carry no data volume: none is printed.

    .venv/bin/python benchmarks/workload_mix.py [--philly FILE] [--pods FILE]

Last line: RESULT <set>_jobs=N <set>_one_gpu_share=S <set>_gang_gpu_time_share=G
<set>_over8_gpu_time_share=L <set>_p50_s=A <set>_p90_s=B <set>_p99_s=C ... for each set.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuyard.domain.accounting import percentile
from gpuyard.sim.metrics import SIZE_CLASSES
from gpuyard.sim.openb import read_pods
from gpuyard.sim.trace import TraceJob, parse_time, read_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEV_WEEK = ("2017-10-01", "2017-10-08", 60.0)  # the window and minimum duration of sim_philly.py


@dataclass(frozen=True)
class Mix:
    """The figures of one set of jobs."""

    jobs: int
    one_gpu_share: float  # of the jobs
    gang_gpu_time_share: float  # of the GPU time, jobs of more than 1 GPU
    over8_gpu_time_share: float  # ... of more than 8 GPUs
    p50_s: float
    p90_s: float
    p99_s: float
    gpu_hours: float
    by_class: dict[str, tuple[int, float]]  # size class -> (jobs, share of the GPU time)


def gpu_seconds(job: TraceJob) -> float:
    """Run time x the GPUs it uses (a fractional request: its share of one)."""
    return job.duration_s * job.gpus * job.gpu_share


def mix(jobs: list[TraceJob]) -> Mix:
    if not jobs:
        raise ValueError("no jobs in this set: check the file and the window")
    total = sum(gpu_seconds(j) for j in jobs)

    def share_of_time(keep: Callable[[TraceJob], bool]) -> float:
        return sum(gpu_seconds(j) for j in jobs if keep(j)) / total if total else 0.0

    durations = [j.duration_s for j in jobs]
    by_class = {
        name: (
            sum(1 for j in jobs if low <= j.gpus <= high),
            share_of_time(lambda j, low=low, high=high: low <= j.gpus <= high),
        )
        for name, low, high in SIZE_CLASSES
    }
    return Mix(
        jobs=len(jobs),
        one_gpu_share=sum(1 for j in jobs if j.gpus == 1) / len(jobs),
        gang_gpu_time_share=share_of_time(lambda j: j.gpus > 1),
        over8_gpu_time_share=share_of_time(lambda j: j.gpus > 8),
        p50_s=percentile(durations, 50) or 0.0,
        p90_s=percentile(durations, 90) or 0.0,
        p99_s=percentile(durations, 99) or 0.0,
        gpu_hours=total / 3600,
        by_class=by_class,
    )


def table(sets: dict[str, tuple[str, Mix]]) -> str:
    head = (
        "| set | what | jobs | 1-GPU jobs | GPU time in >1 GPU | in >8 GPUs | GPU-hours "
        "| duration p50 / p90 / p99 s | "
        + " | ".join(f"{name}: jobs, GPU time" for name, _, _ in SIZE_CLASSES)
        + " |"
    )
    rule = "|" + "---|" * (8 + len(SIZE_CLASSES))
    rows = []
    for key, (what, m) in sets.items():
        classes = " | ".join(
            f"{m.by_class[name][0]:,}, {m.by_class[name][1]:.1%}" for name, _, _ in SIZE_CLASSES
        )
        rows.append(
            f"| {key} | {what} | {m.jobs:,} | {m.one_gpu_share:.1%} | {m.gang_gpu_time_share:.1%} "
            f"| {m.over8_gpu_time_share:.1%} | {m.gpu_hours:,.0f} "
            f"| {m.p50_s:,.0f} / {m.p90_s:,.0f} / {m.p99_s:,.0f} | {classes} |"
        )
    return "\n".join([head, rule, *rows])


def result_line(sets: dict[str, tuple[str, Mix]]) -> str:
    parts = []
    for key, (_, m) in sets.items():
        parts += [
            f"{key}_jobs={m.jobs}",
            f"{key}_one_gpu_share={m.one_gpu_share:.3f}",
            f"{key}_gang_gpu_time_share={m.gang_gpu_time_share:.3f}",
            f"{key}_over8_gpu_time_share={m.over8_gpu_time_share:.3f}",
            f"{key}_p50_s={m.p50_s:.0f}",
            f"{key}_p90_s={m.p90_s:.0f}",
            f"{key}_p99_s={m.p99_s:.0f}",
        ]
    return "RESULT " + " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--philly", type=Path, default=TRACES / "philly_sep_oct_2017.csv")
    parser.add_argument("--pods", type=Path, default=TRACES / "alibaba_openb_pods.csv")
    args = parser.parse_args()

    sets: dict[str, tuple[str, Mix]] = {}
    if args.philly.exists():
        whole = read_trace(args.philly)
        first, last = whole[0].submitted_at, whole[-1].submitted_at
        sets["philly"] = (f"{args.philly.name}, every row ({first:%Y-%m-%d}..{last:%Y-%m-%d})", mix(whole))
        start, end, shortest = DEV_WEEK
        dev = read_trace(args.philly, parse_time(start), parse_time(end), shortest)
        sets["philly_dev"] = (f"dev week [{start}, {end}), jobs >= {shortest:g} s", mix(dev))
    if args.pods.exists():
        pods, counts = read_pods(args.pods)
        left_out = ", ".join(f"{why} {n:,}" for why, n in sorted(counts.skipped.items()))
        what = (
            f"{args.pods.name}, GPU pods ({counts.fractional_placed_whole:,} fractional, at their share); "
            f"left out: {left_out or 'none'}"
        )
        sets["openb"] = (what, mix(pods))
    if not sets:
        raise SystemExit(f"no trace found: {args.philly}, {args.pods}")
    print(table(sets))
    print()
    print("The traces carry no data volume per job: none is given here.")
    print(result_line(sets))


if __name__ == "__main__":
    main()
