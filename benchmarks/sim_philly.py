"""Replay the Philly dev window under all five policies on the standard fleet and compare them.

Standard fleet: N nodes x 8 GPUs (default 64), fast domains of 4 nodes, a quarter of the nodes spot
(mean time between interruptions 24 h), checkpoint cost 30 s, restore 60 s. Jobs of at least 60 s, as
in the reference figures of traces/README.md. `oracle-sjf` (shortest job first by TRUE duration,
simulator only) is shown as an upper bound and never enters the RESULT ratios. `--reference` replays
instead under the reference simulator's assumptions (free preemption, no spot, no interruptions) to
check the baselines; `--free-preemption` keeps the standard fleet and its interruptions but makes
checkpoints and restores free (0 s), to see what the costs change.

    .venv/bin/python benchmarks/sim_philly.py [--trace FILE] [--start T] [--end T] [--nodes N]
        [--reference | --free-preemption] [--policies P,...]
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from gpuyard.sim.charts import run_recorded, write_chart
from gpuyard.sim.engine import SimConfig
from gpuyard.sim.fleet_builder import standard_fleet
from gpuyard.sim.metrics import report, result_line
from gpuyard.sim.trace import parse_time, read_trace

ROOT = Path(__file__).resolve().parents[1]
DEV_TRACE = ROOT.parent / "shared" / "traces" / "philly_sep_oct_2017.csv"
POLICIES = ("fifo", "fifo-backfill", "kueue", "tiresias", "gpuyard")
# Clairvoyant (reads true durations): shown for reference, never in the RESULT ratios.
UPPER_BOUNDS = ("oracle-sjf",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEV_TRACE)
    parser.add_argument("--start", default="2017-10-01")
    parser.add_argument("--end", default="2017-10-08")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--min-duration", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    free = parser.add_mutually_exclusive_group()
    free.add_argument("--reference", action="store_true", help="free preemption, no spot nodes")
    free.add_argument(
        "--free-preemption", action="store_true", help="checkpoint and restore 0 s on the standard fleet"
    )
    parser.add_argument("--policies", default=",".join((*POLICIES, *UPPER_BOUNDS)))
    parser.add_argument("--chart", type=Path, default=Path(".gpuyard/sim/sim_philly.png"), help="PNG written")
    args = parser.parse_args()

    jobs = read_trace(args.trace, parse_time(args.start), parse_time(args.end), args.min_duration)
    if args.reference:
        fleet = standard_fleet(args.nodes, preemptible_nodes=0)
        config = SimConfig(checkpoint_cost_s=0.0, restore_s=0.0, preemptible_mtbi_s=None, seed=args.seed)
    elif args.free_preemption:
        fleet = standard_fleet(args.nodes)
        config = SimConfig(checkpoint_cost_s=0.0, restore_s=0.0, seed=args.seed)
    else:
        fleet = standard_fleet(args.nodes)
        config = SimConfig(seed=args.seed)
    gpus = sum(n.gpus for n in fleet.nodes)
    spot = sum(1 for n in fleet.nodes if n.preemptible)
    print(
        f"trace {args.trace.name} [{args.start}, {args.end}), jobs >= {args.min_duration:g} s: {len(jobs)}; "
        f"fleet {args.nodes} nodes x 8 = {gpus} GPUs, domains of 4 nodes, {spot} spot nodes; "
        f"checkpoint {config.checkpoint_cost_s:g} s, restore {config.restore_s:g} s, "
        f"spot MTBI {(config.preemptible_mtbi_s or 0) / 3600:g} h; "
        f"{platform.machine()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    summaries, runs = {}, []
    for name in args.policies.split(","):
        run = run_recorded(jobs, fleet, name, config, progress=True)
        summaries[name] = run.summary
        runs.append((run.result, run.recorder))
        print(f"{name}: {run.wall_s:.1f} s wall, {run.summary.cycles} cycles", flush=True)
    print()
    print(report(list(summaries.values())))
    print()
    if set(UPPER_BOUNDS) & set(summaries):
        print("oracle-sjf knows every job's true duration: an upper bound, not a baseline; no ratio uses it.")
        print()
    print("chart:", write_chart(runs, args.chart, title=f"{args.trace.name} [{args.start}, {args.end})"))
    if set(POLICIES) <= set(summaries):
        print(result_line(summaries))


if __name__ == "__main__":
    main()
