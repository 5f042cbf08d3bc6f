"""gpuyard against the baselines on every week of a Philly-format trace, at several fleet sizes.

Weeks start on Sundays (the dev window 2017-10-01..08 is one of them), from the week of the trace's
first submit to that of its last (the last one may be partial; it is marked so). On each week and
fleet size: the standard fleet (`docs/simulator.md`), jobs of at least --min-duration, every policy
of --policies; the table gives gpuyard's average JCT over tiresias' (the target: below 1 everywhere),
and the other sim_philly ratios. `--workers` runs that many simulations at once.

    .venv/bin/python benchmarks/sim_weeks.py [--trace FILE] [--nodes 40,48,64] [--weeks 2017-10-01,...]
        [--workers 1]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

from gpuyard.sim.charts import write_ratio_grid
from gpuyard.sim.engine import SimConfig
from gpuyard.sim.fleet_builder import standard_fleet
from gpuyard.sim.metrics import Summary, ratio, summarize
from gpuyard.sim.run import simulate
from gpuyard.sim.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly_sep_oct_2017.csv"
POLICIES = ("fifo", "fifo-backfill", "kueue", "tiresias", "gpuyard")
WEEK = timedelta(days=7)


def weeks(trace: Path, min_duration_s: float) -> list[tuple[datetime, datetime, bool]]:
    """(start, end, whole) of each Sunday-to-Sunday week the trace's submits touch."""
    jobs = read_trace(trace, min_duration_s=min_duration_s)
    first, last = jobs[0].submitted_at, jobs[-1].submitted_at
    start = (first - timedelta(days=(first.weekday() + 1) % 7)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    found = []
    while start <= last:
        found.append((start, start + WEEK, start + WEEK <= last))
        start += WEEK
    return found


def run_one(
    task: tuple[Path, datetime, datetime, float, int, str],
) -> tuple[datetime, int, str, Summary, float]:
    trace, start, end, min_duration_s, nodes, policy = task
    jobs = read_trace(trace, start, end, min_duration_s)
    began = time.perf_counter()
    summary = summarize(simulate(jobs, standard_fleet(nodes), policy, SimConfig()))
    return start, nodes, policy, summary, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--nodes", default="40,48,64", help="fleet sizes, comma-separated")
    parser.add_argument("--min-duration", type=float, default=60.0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workers", type=int, default=1, help="simulations run at once")
    parser.add_argument("--weeks", default="", help="only the weeks starting on these days (YYYY-MM-DD,...)")
    parser.add_argument("--chart", type=Path, default=Path(".gpuyard/sim/sim_weeks.png"), help="PNG written")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    policies = args.policies.split(",")
    if not {"gpuyard", "tiresias"} <= set(policies):
        parser.error("--policies must include gpuyard and tiresias (the table compares them)")
    found = weeks(args.trace, args.min_duration)
    if args.weeks:
        chosen = set(args.weeks.split(","))
        unknown = chosen - {f"{s:%Y-%m-%d}" for s, _, _ in found}
        if unknown:
            parser.error(f"--weeks: no week of the trace starts on {', '.join(sorted(unknown))}")
        found = [w for w in found if f"{w[0]:%Y-%m-%d}" in chosen]
    tasks = [
        (args.trace, s, e, args.min_duration, n, p) for s, e, _ in found for n in sizes for p in policies
    ]
    print(
        f"{len(found)} weeks x {len(sizes)} fleet sizes x {len(policies)} policies: {len(tasks)} runs",
        flush=True,
    )
    results: dict[tuple[datetime, int, str], Summary] = {}
    with ProcessPoolExecutor(max_workers=max(args.workers, 1)) as pool:
        for start, nodes, policy, summary, wall in pool.map(run_one, tasks):
            results[(start, nodes, policy)] = summary
            print(
                f"{start:%Y-%m-%d} {nodes} nodes {policy}: {summary.jobs} jobs, "
                f"avg JCT {summary.avg_jct_h:.3f} h, {summary.preemptions} preemptions, {wall:.1f} s",
                flush=True,
            )
    print()
    others = [p for p in ("fifo", "fifo-backfill", "kueue") if p in policies]
    head = ["week", "jobs", *(f"{n} nodes" for n in sizes)]
    print("gpuyard avg JCT / tiresias avg JCT (gpuyard preemptions / tiresias preemptions):")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for start, end, whole in found:
        cells = []
        for n in sizes:
            ours, theirs = results[(start, n, "gpuyard")], results[(start, n, "tiresias")]
            cells.append(
                f"{ratio(ours.avg_jct_h, theirs.avg_jct_h):.3f} ({ours.preemptions} / {theirs.preemptions})"
            )
        label = f"{start:%m-%d}..{end:%m-%d}" + ("" if whole else " (partial)")
        jobs = results[(start, sizes[0], "gpuyard")].jobs
        print(f"| {label} | {jobs} | " + " | ".join(cells) + " |")
    grid = [
        [ratio(results[(s, n, "gpuyard")].avg_jct_h, results[(s, n, "tiresias")].avg_jct_h) for n in sizes]
        for s, _, _ in found
    ]
    rows = [f"{s:%m-%d}..{e:%m-%d}" for s, e, _ in found]
    title = "gpuyard avg JCT / tiresias avg JCT, per week and fleet size"
    print("\nchart:", write_ratio_grid(rows, [f"{n} nodes" for n in sizes], grid, args.chart, title))
    if not others:
        return
    print()
    print("Every sim_philly ratio of gpuyard, per week and fleet size:")
    print()
    titles = ["week", "nodes", "vs fifo", "vs tiresias", "p99 wait vs fifo-backfill", "util vs fifo-backfill"]
    print("| " + " | ".join([*titles, "goodput", "Jain vs kueue"]) + " |")
    print("|" + "---|" * (len(titles) + 2))
    for start, end, _ in found:
        for n in sizes:
            row = {p: results[(start, n, p)] for p in policies}
            cells = [
                _vs(row, "fifo", "avg_jct_h"),
                _vs(row, "tiresias", "avg_jct_h"),
                _vs(row, "fifo-backfill", "p99_wait_h"),
                _vs(row, "fifo-backfill", "utilization"),
                f"{row['gpuyard'].goodput:.3f}",
                _vs(row, "kueue", "jain"),
            ]
            print(f"| {start:%m-%d}..{end:%m-%d} | {n} | " + " | ".join(cells) + " |")


def _vs(row: dict[str, Summary], baseline: str, key: str) -> str:
    """gpuyard's figure over the baseline's, or '-' when the baseline was not run."""
    if baseline not in row:
        return "-"
    return f"{ratio(getattr(row['gpuyard'], key), getattr(row[baseline], key)):.3f}"


if __name__ == "__main__":
    main()
