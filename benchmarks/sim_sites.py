"""Two sites, one of them losing half its nodes for 12 hours: do moves between sites pay?

Replays a window of a Philly-format trace (default the dev week 2017-10-01..08, jobs of at least
60 s) on two sites, `a` and `b`, each the standard fleet of 32 nodes x 8 GPUs (domains of 4 nodes, the
last quarter spot, MTBI 24 h; checkpoint 30 s, restore 60 s). Each virtual cluster (team) submits at
its home site: teams by GPU-time in the window, largest first, each to the site with the least so
far (`--split alternate`: sorted by name, dealt in turn). From hour 24 to hour 36 of the window
site b loses half its nodes (its first 16, whole domains of on-demand nodes). The WAN: 40 ms RTT,
egress $0.02/GB, 10 Gbit/s (and 1 Gbit/s for the second gpuyard run). A job's checkpoint is 16 bytes
x its parameters, the parameters from its GPU count (`sim.sites.PARAMS_BY_GPUS`, a step: 1 GPU 1B,
2: 2B, 4: 3B, 8: 7B, 16: 13B, 32: 30B, 64 and more: 70B).

Policies: `stay` (a job waits for the site holding its checkpoint, else its home) and `gpuyard` (the
same, but a job waiting there starts or resumes at another site with room once its wait so far
reaches its checkpoint's copy time; a job not started yet copies nothing, its data being at both
sites unless `--staging-gb` puts that much at its home site, which an attempt elsewhere then stages
first). docs/simulator.md, "Sites".

    .venv/bin/python benchmarks/sim_sites.py [--trace FILE] [--start T] [--end T] [--split gpu_time]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

from gpuyard.domain.sites import Wan, transfer_s
from gpuyard.sim.engine import SimConfig, SimResult
from gpuyard.sim.metrics import Summary, ratio, summarize
from gpuyard.sim.run import simulate
from gpuyard.sim.sites import (
    BYTES_PER_PARAM,
    PARAMS_BY_GPUS,
    SPLITS,
    SiteEvent,
    SiteModel,
    home_sites,
    site_fleet,
)
from gpuyard.sim.trace import parse_time, read_trace

ROOT = Path(__file__).resolve().parents[1]
DEV_TRACE = ROOT.parent / "shared" / "traces" / "philly_sep_oct_2017.csv"
SITES = ("a", "b")


def avg_jct_by_site(result: SimResult, home: dict[str, str]) -> dict[str, float]:
    """Average JCT (hours) of the jobs of each home site."""
    jct: dict[str, list[float]] = defaultdict(list)
    for job in result.jobs:
        jct[home[job.team]].append(job.jct_s / 3600)
    return {site: sum(v) / len(v) for site, v in sorted(jct.items())}


def table(rows: list[tuple[str, Summary, dict[str, float], float]]) -> str:
    head = (
        "| run | jobs | avg JCT h | p50 JCT h | p99 JCT h | p50 wait h | p99 wait h | "
        + " | ".join(f"avg JCT h, home {s}" for s in SITES)
        + " | moves | with checkpoint | TB moved | egress $ | copies at once, peak | preempt | wall s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, s, by_site, wall in rows:
        lines.append(
            f"| {label} | {s.jobs} | {s.avg_jct_h:.3f} | {s.p50_jct_h:.3f} | {s.p99_jct_h:.1f} | "
            f"{s.p50_wait_h:.3f} | {s.p99_wait_h:.2f} | "
            + " | ".join(f"{by_site.get(site, 0.0):.3f}" for site in SITES)
            + f" | {s.moves} | {s.checkpoint_moves} | {s.tb_moved:.2f} | {s.egress_usd:,.0f} | "
            f"{s.peak_copies} | {s.preemptions} | {wall:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEV_TRACE)
    parser.add_argument("--start", default="2017-10-01")
    parser.add_argument("--end", default="2017-10-08")
    parser.add_argument("--min-duration", type=float, default=60.0)
    parser.add_argument("--nodes-per-site", type=int, default=32)
    parser.add_argument("--split", default="gpu_time", choices=sorted(SPLITS), help="teams to home sites")
    parser.add_argument("--event-from-h", type=float, default=24.0, help="hours into the window")
    parser.add_argument("--event-to-h", type=float, default=36.0)
    parser.add_argument("--event-fraction", type=float, default=0.5, help="of site b's nodes down; 0: none")
    parser.add_argument("--rtt-ms", type=float, default=40.0)
    parser.add_argument("--egress", type=float, default=0.02, help="USD per GB leaving a site")
    parser.add_argument("--gbit", type=float, default=10.0, help="WAN Gbit/s of the RESULT ratio")
    parser.add_argument("--slow-gbit", type=float, default=1.0, help="WAN Gbit/s of the _1g ratio")
    parser.add_argument("--seed", type=int, default=0, help="seed of the spot interruptions")
    parser.add_argument(
        "--staging-gb",
        type=float,
        default=0.0,
        help="GB of data each job reads, at its home site: an attempt elsewhere stages it; 0: none",
    )
    args = parser.parse_args()

    began = time.perf_counter()
    window = parse_time(args.start)
    jobs = read_trace(args.trace, window, parse_time(args.end), args.min_duration)
    fleet = site_fleet(SITES, args.nodes_per_site)
    home = home_sites(jobs, SITES, args.split)
    events = (
        (
            SiteEvent(
                "b",
                window + timedelta(hours=args.event_from_h),
                window + timedelta(hours=args.event_to_h),
                args.event_fraction,
            ),
        )
        if args.event_fraction > 0
        else ()
    )
    fast = Wan(args.gbit, args.rtt_ms / 1000, args.egress)
    slow = Wan(args.slow_gbit, args.rtt_ms / 1000, args.egress)

    print(
        f"trace {args.trace.name} [{args.start}, {args.end}), jobs >= {args.min_duration:g} s: {len(jobs)}; "
        f"{len(SITES)} sites x {args.nodes_per_site} nodes x 8 GPUs (domains of 4 nodes, a quarter spot); "
        f"{platform.machine()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    demand: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for job in jobs:
        demand[job.team] += job.gpus * job.duration_s
        count[job.team] += 1
    total = sum(demand.values()) or 1.0
    for site in SITES:
        teams = sorted((t for t in home if home[t] == site), key=lambda t: -demand[t])
        share = sum(demand[t] for t in teams) / total
        print(
            f"site {site} (split {args.split}): {len(teams)} teams, {share:.1%} of the GPU-time, "
            f"{sum(count[t] for t in teams)} jobs: {', '.join(teams)}"
        )
    for event in events:
        print(
            f"site event: {len(event.nodes(fleet))} of site b's {args.nodes_per_site} nodes down from "
            f"{event.start:%Y-%m-%d %H:%M} to {event.end:%Y-%m-%d %H:%M} "
            f"(hours {args.event_from_h:g}..{args.event_to_h:g})"
        )
    if not events:
        print("site event: none (--event-fraction 0)")
    print(
        f"each job reads {args.staging_gb:g} GB of data held at its home site: an attempt elsewhere stages it"
        if args.staging_gb
        else "a job's data and image are at both sites: nothing is staged"
    )
    print(
        f"WAN: RTT {args.rtt_ms:g} ms, egress ${args.egress:g}/GB; "
        f"checkpoint {BYTES_PER_PARAM:g} B x parameters; "
        "copy time per GPU count at "
        + " and ".join(f"{w.gbit_s:g} Gbit/s" for w in (fast, slow))
        + ": "
        + ", ".join(
            f"{g}: {BYTES_PER_PARAM * p / 1e9:,.0f} GB "
            + "/".join(f"{transfer_s(BYTES_PER_PARAM * p, w):,.0f}" for w in (fast, slow))
            + " s"
            for g, p in PARAMS_BY_GPUS
        ),
        flush=True,
    )

    runs = (
        ("stay", "stay", fast),
        (f"gpuyard {args.gbit:g}G", "gpuyard", fast),
        (f"gpuyard {args.slow_gbit:g}G", "gpuyard", slow),
    )
    rows: list[tuple[str, Summary, dict[str, float], float]] = []
    for label, policy, wan in runs:
        start = time.perf_counter()
        model = SiteModel(wan=wan, home=home, events=events, staging_bytes=args.staging_gb * 1e9)
        config = SimConfig(seed=args.seed, sites=model)
        result = simulate(jobs, fleet, policy, config, progress=True)
        summary = summarize(result)
        wall = time.perf_counter() - start
        if policy == "stay" and summary.moves:
            raise SystemExit(f"stay moved {summary.moves} attempts between sites: a bug")
        rows.append((label, summary, avg_jct_by_site(result, home), wall))
        print(
            f"{label}: {wall:.1f} s wall, {summary.cycles} cycles, avg JCT {summary.avg_jct_h:.3f} h, "
            f"p99 wait {summary.p99_wait_h:.2f} h, {summary.moves} moves",
            flush=True,
        )
    print()
    print(table(rows))
    print()
    (_, stay, _, _), (_, moved, _, _), (_, moved_slow, _, _) = rows
    print(f"total wall {time.perf_counter() - began:.0f} s")
    print(
        f"RESULT move_vs_stay_avg_jct={ratio(moved.avg_jct_h, stay.avg_jct_h):.3f} moves={moved.moves} "
        f"tb_moved={moved.tb_moved:.2f} egress_usd={moved.egress_usd:.0f} "
        f"move_vs_stay_avg_jct_1g={ratio(moved_slow.avg_jct_h, stay.avg_jct_h):.3f}"
    )


if __name__ == "__main__":
    main()
