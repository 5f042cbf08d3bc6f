"""Replay a window of a Philly-format trace under the public Tiresias simulator's model and compare.

The model (`gpuyard.sim.reference`): free preemption, fixed durations, switches of 4 nodes x 8 GPUs,
FIFO with the `count` and `yarn` placements, DLAS-GPU (our `tiresias`) by count, and gpuyard's policy
with its own domain placement on the switches. Jobs of at least --min-duration (60 s, as the public
figures of traces/README.md). On the dev week at 48 or 64 nodes the public figures are printed beside.

    .venv/bin/python benchmarks/sim_reference.py [--trace FILE] [--start D] [--end D] [--nodes N]
        [--variants fifo_count,fifo_yarn,dlas,gpuyard]

Prints `RESULT fifo_count_h=A fifo_yarn_h=B dlas_h=C gpuyard_h=G` (average JCT, hours) for the
default variants, `<variant>_h=...` for those of --variants. Other variants (`sim.reference.VARIANTS`):
`dlas_entry` (DLAS-GPU with the public order within a queue), `gpuyard_run0` and `gpuyard_count_run0`
(gpuyard without its minimum run, on the switches and by count).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuyard.sim.metrics import Summary, summarize
from gpuyard.sim.reference import DEFAULT_VARIANTS, REFERENCE_CONFIG, VARIANTS
from gpuyard.sim.run import simulate
from gpuyard.sim.trace import parse_time, read_trace

ROOT = Path(__file__).resolve().parents[1]
DEV_TRACE = ROOT.parent / "shared" / "traces" / "philly_sep_oct_2017.csv"
DEV_WEEK = ("2017-10-01", "2017-10-08")
# traces/README.md "Reference figures": (GPUs, variant) -> (avg JCT h, median h, p99 h, avg pending h)
PUBLIC: dict[tuple[int, str], tuple[float, float, float, float]] = {
    (384, "fifo_count"): (20.82, 22.12, 77.4, 18.36),
    (384, "fifo_yarn"): (48.01, 39.21, 124.6, 45.55),
    (384, "dlas"): (2.81, 0.673, 54.0, 0.35),
    (512, "fifo_count"): (5.09, 3.018, 46.5, 2.63),
    (512, "fifo_yarn"): (15.36, 5.399, 68.5, 12.90),
    (512, "dlas"): (2.51, 0.672, 47.2, 0.06),
}
# Variants compared with the public figures of another: DLAS-GPU with the public order within a queue.
STANDS_FOR = {"dlas_entry": "dlas"}


def row(name: str, s: Summary, public: tuple[float, float, float, float] | None) -> str:
    ours = f"{s.avg_jct_h:8.2f} {s.p50_jct_h:8.3f} {s.p99_jct_h:8.1f} {s.avg_pending_h:8.2f}"
    ours += f" {s.preemptions:8d}"
    if public is None:
        return f"{name:<18} {ours}"
    theirs = f"{public[0]:8.2f} {public[1]:8.3f} {public[2]:8.1f} {public[3]:8.2f}"
    return f"{name:<18} {ours}   {theirs}   {s.avg_jct_h / public[0] - 1:+7.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEV_TRACE)
    parser.add_argument("--start", default=DEV_WEEK[0])
    parser.add_argument("--end", default=DEV_WEEK[1])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--min-duration", type=float, default=60.0)
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="; ".join(f"{v.name}: {v.about}" for v in VARIANTS.values()),
    )
    args = parser.parse_args()
    unknown = [name for name in args.variants.split(",") if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")

    jobs = read_trace(args.trace, parse_time(args.start), parse_time(args.end), args.min_duration)
    gpus = args.nodes * 8
    dev = args.trace.name == DEV_TRACE.name and (args.start, args.end) == DEV_WEEK
    print(
        f"trace {args.trace.name} [{args.start}, {args.end}), jobs >= {args.min_duration:g} s: {len(jobs)}; "
        f"{args.nodes} nodes x 8 = {gpus} GPUs, switches of 4 nodes; the public simulator's model",
        flush=True,
    )
    summaries: dict[str, Summary] = {}
    for name in args.variants.split(","):
        variant = VARIANTS[name]
        began = time.perf_counter()
        result = simulate(jobs, variant.fleet(args.nodes), variant.build(), REFERENCE_CONFIG, progress=True)
        summaries[name] = summarize(result)
        print(f"{name}: {time.perf_counter() - began:.1f} s wall, {result.totals.cycles} cycles", flush=True)
    print()
    head = f"{'variant':<18} {'avg JCT':>8} {'p50':>8} {'p99':>8} {'pending':>8} {'preempt':>8}"
    print(head + ("   public: avg      p50      p99  pending   avg vs public" if dev else ""))
    for name, s in summaries.items():
        print(row(name, s, PUBLIC.get((gpus, STANDS_FOR.get(name, name))) if dev else None))
    print()
    print("RESULT " + " ".join(f"{name}_h={s.avg_jct_h:.2f}" for name, s in summaries.items()))


if __name__ == "__main__":
    main()
