"""`gpuyard sim`: replay a Philly-format trace on a fleet under one or more policies, print the figures
(a narrow table; `--wide` every column) and write a chart of the run beside it (sim/charts.py).

A plain function with typer annotations; the CLI registers it as a command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from gpuyard.domain.fleet import load_fleet
from gpuyard.sim.engine import SimConfig, SimulationError
from gpuyard.sim.fleet_builder import standard_fleet
from gpuyard.sim.run import POLICY_NAMES, check_policy
from gpuyard.sim.trace import TraceError, parse_time, read_trace
from rich.console import Console
from rich.table import Table

# The narrow table's columns (sim/metrics.py COLUMNS keys): what fits a 100-column terminal.
NARROW = ("policy", "jobs", "avg_jct_h", "p99_jct_h", "p99_wait_h", "utilization", "goodput", "preemptions")


def _time(value: str | None, option: str) -> object:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


def sim(
    trace: Annotated[Path, typer.Option("--trace", help="Job trace in the Philly CSV format.")],
    fleet: Annotated[
        Path | None,
        typer.Option("--fleet", help="Fleet YAML ({nodes: [...]}) [default: the standard 64 x 8 GPU fleet]."),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help=f"One or more, comma-separated: {', '.join(POLICY_NAMES)}. "
            "oracle-sjf reads true durations: an upper bound, simulator only.",
        ),
    ] = "gpuyard",
    start: Annotated[str | None, typer.Option("--start", help="Replay jobs submitted from (UTC).")] = None,
    end: Annotated[str | None, typer.Option("--end", help="... and before this time (UTC).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    min_duration: Annotated[float, typer.Option("--min-duration", help="Skip jobs shorter (s).")] = 0.0,
    checkpoint_cost: Annotated[float, typer.Option("--checkpoint-cost", help="Seconds a checkpoint.")] = 30.0,
    restore: Annotated[float, typer.Option("--restore", help="Seconds to restore a checkpoint.")] = 60.0,
    spot_mtbi_h: Annotated[
        float, typer.Option("--spot-mtbi-h", help="Mean hours between spot interruptions; 0: none.")
    ] = 24.0,
    quota_rule: Annotated[str, typer.Option("--quota-rule", help="'share' or 'equal'.")] = "share",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the interruptions.")] = 0,
    cycle_period: Annotated[
        float,
        typer.Option("--cycle-period", min=0.0, help="Seconds of events applied before one cycle; 0: each."),
    ] = 0.0,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column (a terminal of 240 characters).")
    ] = False,
    chart: Annotated[
        Path | None,
        typer.Option(
            "--chart",
            help="Where the run's PNG goes [default: .gpuyard/sim/<trace>-<policies>.png]; '-': none.",
        ),
    ] = None,
) -> None:
    """Replay a trace through the real scheduling cycle with a virtual clock."""
    # numpy and matplotlib: only when a sim runs (every `gpuyard` command imports this module)
    from gpuyard.sim.charts import run_recorded, write_chart
    from gpuyard.sim.metrics import COLUMNS, shown

    try:
        policies = [check_policy(name.strip()) for name in policy.split(",") if name.strip()]
        jobs = read_trace(trace, _time(start, "--start"), _time(end, "--end"), min_duration)  # type: ignore[arg-type]
        chosen_fleet = load_fleet(fleet) if fleet is not None else standard_fleet()
        config = SimConfig(
            checkpoint_cost_s=checkpoint_cost,
            restore_s=restore,
            preemptible_mtbi_s=spot_mtbi_h * 3600.0 if spot_mtbi_h > 0 else None,
            seed=seed,
            cycle_period_s=cycle_period,
        )
        summaries, runs = [], []
        for chosen in policies:
            run = run_recorded(
                jobs, chosen_fleet, chosen, config, quota_rule=quota_rule, progress=not as_json
            )
            summaries.append((run.summary, run.wall_s))
            runs.append((run.result, run.recorder))
    except (TraceError, ValueError, SimulationError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    drawn = None
    if str(chart) != "-" and jobs:
        default = Path(".gpuyard") / "sim" / f"{trace.stem}-{'-'.join(policies)}.png"
        drawn = write_chart(runs, chart or default, title=trace.name)
    if as_json:
        typer.echo(json.dumps([{**s.as_dict(), "wall_s": round(w, 2)} for s, w in summaries], indent=2))
        return
    columns = COLUMNS if wide else tuple(c for c in COLUMNS if c[0] in NARROW)
    table = Table(title=f"{trace.name}: {len(jobs)} jobs, {sum(n.gpus for n in chosen_fleet.nodes)} GPUs")
    for _, title, _ in columns:
        table.add_column(title, justify="left" if title == "policy" else "right")
    table.add_column("wall s", justify="right")
    for summary, wall in summaries:
        table.add_row(*(shown(fmt, getattr(summary, key)) for key, _, fmt in columns), f"{wall:.1f}")
    Console(width=240 if wide else 100).print(table)
    if not wide:
        typer.echo("(--wide: every column)")
    if drawn is not None:
        typer.echo(f"chart: {drawn}")
