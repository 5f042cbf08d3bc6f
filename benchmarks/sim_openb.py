"""Replay the Alibaba OpenB GPU cluster trace (heterogeneous fleet) under every policy and compare them.

Pods asking whole GPUs are jobs limited to the GPU models of their `gpu_spec`; pods without GPUs and
pods never scheduled in the trace are counted and left out; fractional requests are placed on one whole
GPU (`--fractional whole`, their share counts as kept work in goodput) or left out (`skip`). See
`gpuyard.sim.openb` for the reading rules.

The published pods are a sample: at the trace's own pace they ask about 1% of the cluster's GPU-time,
so every policy places every pod at once. To replay contention, the fleet keeps `--share` of the nodes
of each (model, GPUs) group (default an eighth: 158 nodes, 797 GPUs, same mix) and the submit times
are divided by `--speedup` (default 1000; run times unchanged). No spot nodes, no interruptions
(the trace has none); checkpoint 30 s, restore 60 s. Besides the sim_philly figures, it prints the
GPUs stranded by fragmentation (free GPUs no queued job fits) per policy, over the replay.

    .venv/bin/python benchmarks/sim_openb.py [--share 0.125] [--speedup 1000] [--fractional whole]
"""

from __future__ import annotations

import argparse
import os
import platform
from collections import Counter
from pathlib import Path

from gpuyard.sim.charts import run_recorded, write_chart
from gpuyard.sim.engine import SimConfig
from gpuyard.sim.metrics import BASELINES, report, result_line, stranded_over_time
from gpuyard.sim.openb import FRACTIONAL, read_nodes, read_pods

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
PERIODS = 8  # stranded GPUs are shown per eighth of the submit window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=Path, default=TRACES / "alibaba_openb_pods.csv")
    parser.add_argument("--nodes", type=Path, default=TRACES / "alibaba_openb_gpu_nodes.csv")
    parser.add_argument("--share", type=float, default=0.125, help="of the nodes of each model kept")
    parser.add_argument("--speedup", type=float, default=1000.0, help="submit times divided by this")
    parser.add_argument("--fractional", choices=FRACTIONAL, default="whole")
    parser.add_argument("--start", type=float, default=None, help="trace seconds: pods created from")
    parser.add_argument("--end", type=float, default=None, help="... and before")
    parser.add_argument("--policies", default=",".join((*BASELINES, "gpuyard")))
    parser.add_argument("--chart", type=Path, default=Path(".gpuyard/sim/sim_openb.png"), help="PNG written")
    args = parser.parse_args()

    jobs, counts = read_pods(
        args.pods, start_s=args.start, end_s=args.end, speedup=args.speedup, fractional=args.fractional
    )
    fleet = read_nodes(args.nodes, share=args.share)
    models = Counter(n.gpu_type for n in fleet.nodes for _ in range(n.gpus))
    constrained = sum(1 for j in jobs if j.gpu_types)
    print(
        f"pods {args.pods.name}: {counts.jobs} jobs ({constrained} with GPU-model constraints, "
        f"{counts.fractional_placed_whole} fractional placed on a whole GPU), "
        f"left out {dict(counts.skipped)}; speedup {args.speedup:g}"
    )
    print(
        f"fleet {len(fleet.nodes)} nodes ({args.share:g} of {args.nodes.name}), {sum(models.values())} GPUs "
        f"{dict(sorted(models.items()))}; {platform.machine()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    config = SimConfig(preemptible_mtbi_s=None)
    summaries, stranded, runs = {}, {}, []
    for name in args.policies.split(","):
        run = run_recorded(jobs, fleet, name, config, progress=True)
        summaries[name] = run.summary
        runs.append((run.result, run.recorder))
        stranded[name] = stranded_over_time(run.result, PERIODS)
        print(f"{name}: {run.wall_s:.1f} s wall, {run.summary.cycles} cycles", flush=True)
    print()
    print(report(list(summaries.values())))
    print()
    print(
        "GPUs stranded by fragmentation (free, no queued job fits), average per eighth of the submit window:"
    )
    print()
    print("| policy | average | " + " | ".join(f"{k + 1}/{PERIODS}" for k in range(PERIODS)) + " |")
    print("|---|---|" + "---|" * PERIODS)
    for name, series in stranded.items():
        cells = " | ".join(f"{value:.1f}" for value in series)
        print(f"| {name} | {summaries[name].stranded_gpus:.1f} | {cells} |")
    print()
    print("chart:", write_chart(runs, args.chart, title=f"Alibaba OpenB, {args.share:g} of the nodes"))
    if {*BASELINES, "gpuyard"} <= set(summaries):
        print(result_line(summaries))


if __name__ == "__main__":
    main()
