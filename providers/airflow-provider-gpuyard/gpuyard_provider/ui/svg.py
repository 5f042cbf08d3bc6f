"""The page's pictures as SVG strings: the fleet grid, a job's timeline, line charts. Pure functions of
the API's JSON; every mark carries data- attributes (what it shows) and a <title> (its tooltip)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7")
FREE, OTHERS, UNHEALTHY = "#e8f1e4", "#b8b8b8", "#d62728"
STATE_COLOURS = {
    "CREATED": "#c7c7c7",
    "LAUNCHING": "#9ecae1",
    "RUNNING": "#4e79a7",
    "SUCCEEDED": "#59a14f",
    "FAILED": "#d62728",
    "PREEMPTED": "#f28e2b",
    "LOST": "#8c564b",
    "CANCELLED": "#7f7f7f",
}
CELL, GAP = 14, 2
# Taints that say a node is unwell (Kubernetes' node-condition taints, and gpuyard's own), as opposed
# to those that only reserve a node for some jobs (spot capacity, a team's nodes).
UNHEALTHY_TAINTS = ("node.kubernetes.io/", "gpuyard.io/unhealthy")


def colours(teams: Iterable[str]) -> dict[str, str]:
    """A colour per team, by its place among the teams the caller sees (the same on every part of
    the page); a team beyond the palette shares one."""
    return {team: PALETTE[i % len(PALETTE)] for i, team in enumerate(sorted(set(teams)))}


def colour(key: str, known: Mapping[str, str] | None = None) -> str:
    """The team's colour in `known`, else one by a hash of its name."""
    return (known or {}).get(key) or PALETTE[zlib.crc32(key.encode()) % len(PALETTE)]


def unhealthy(node: Mapping[str, Any]) -> bool:
    return any(str(t).startswith(UNHEALTHY_TAINTS) for t in node.get("taints") or ())


def _a(value: object) -> str:
    return escape(str(value), quote=True)


def parse_time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


# -- the fleet ----------------------------------------------------------------------------------------


def fleet_grid(
    nodes: Sequence[Mapping[str, Any]], width: int = 1100, team_colours: Mapping[str, str] | None = None
) -> str:
    """Sites, then their fast domains, then nodes as boxes of GPU cells: free, leased by a visible
    job (its team's colour), leased by another team; an unhealthy node (a node-condition taint) is
    outlined in red, a node reserved by other taints (spot) dashed."""
    by_domain: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for node in nodes:
        by_domain.setdefault((node["site"], node["cluster"], node["domain"]), []).append(node)
    parts: list[str] = []
    y, site = 0, None
    for (site_name, cluster, domain), members in sorted(by_domain.items()):
        if site_name != site:
            site = site_name
            y += 22
            parts.append(f'<text class="site" x="0" y="{y}">site {_a(site_name)}</text>')
        y += 18
        parts.append(f'<text class="domain" x="8" y="{y}">{_a(cluster)} / domain {_a(domain)}</text>')
        y += 6
        x, row_height = 8, 0
        for node in sorted(members, key=lambda n: n["name"]):
            box, w, h = _node(node, team_colours)
            if x + w > width and x > 8:
                x, y = 8, y + row_height + 8
                row_height = 0
            parts.append(f'<g transform="translate({x},{y})">{box}</g>')
            x += w + 8
            row_height = max(row_height, h)
        y += row_height + 4
    return (
        f'<svg class="fleet" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 8}" '
        f'viewBox="0 0 {width} {y + 8}">{"".join(parts)}</svg>'
    )


def _node(node: Mapping[str, Any], team_colours: Mapping[str, str] | None) -> tuple[str, int, int]:
    gpus = int(node["gpus"])
    columns = min(8, max(1, gpus))
    rows = max(1, -(-gpus // columns))
    w = max(columns * (CELL + GAP) + 6, 64)
    h = rows * (CELL + GAP) + 22
    holders = {int(lease["gpu"]): lease for lease in node.get("leases", [])}
    others = max(0, gpus - int(node["free_gpus"]) - len(holders))  # leased, by jobs the caller can't see
    sick = unhealthy(node)
    cells = []
    for gpu in range(gpus):
        cx, cy = 3 + (gpu % columns) * (CELL + GAP), 18 + (gpu // columns) * (CELL + GAP)
        lease = holders.get(gpu)
        if lease is not None:
            fill, state = colour(lease["team"], team_colours), "leased"
            tip = f"GPU {gpu}: {lease['job_name']} ({lease['job_id']}, team {lease['team']})"
            extra = f' data-job="{_a(lease["job_id"])}" data-team="{_a(lease["team"])}"'
        elif others > 0:
            others -= 1
            fill, state, tip, extra = OTHERS, "leased", f"GPU {gpu}: leased by another team", ""
        else:
            fill, state, tip, extra = FREE, "free", f"GPU {gpu}: free", ""
        if sick:
            state = f"{state} unhealthy"
        if node.get("taints"):
            tip = f"{tip}; node tainted {', '.join(node['taints'])}"
        cells.append(
            f'<rect class="gpu {state}" x="{cx}" y="{cy}" width="{CELL}" height="{CELL}" rx="2" '
            f'fill="{fill}"{extra}><title>{_a(tip)}</title></rect>'
        )
    border = UNHEALTHY if sick else "#888"
    dash = ' stroke-dasharray="3 2"' if node.get("taints") and not sick else ""
    label = f"{node['name']} · {node['gpu_type']} · {node['free_gpus']}/{gpus} free"
    box = (
        f'<g class="node" data-node="{_a(node["name"])}"><rect width="{w}" height="{h}" rx="4" '
        f'fill="white" stroke="{border}"{dash}/>'
        f'<text x="3" y="12" class="node-label">{_a(node["name"])}</text>'
        f"<title>{_a(label)}</title>{''.join(cells)}</g>"
    )
    return box, w, h


# -- a job's timeline ---------------------------------------------------------------------------------


def timeline(job: Mapping[str, Any], now: datetime, width: int = 1000) -> str:
    """A row of the job's waits in the queue (from submission, and after each interrupted attempt),
    then one row per attempt from its placement to its end, coloured by its state (lighter while it
    launches), with its checkpoints (diamonds), stop notices (triangles) and its end (labelled:
    PREEMPTED, LOST, ...)."""
    attempts = job.get("attempts") or []
    events = job.get("events") or []
    start = parse_time(job["created_at"]) or now
    times = [parse_time(e["at"]) for e in events if e.get("at")]
    end = max(
        [now if job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED") else start, *filter(None, times)]
    )
    span = max(1.0, (end - start).total_seconds())
    left, row = 230, 34
    plot = width - left - 20

    def x(at: datetime | None) -> float:
        return left + plot * max(0.0, min(1.0, ((at or end) - start).total_seconds() / span))

    ends: dict[str, datetime] = {}
    for e in events:
        if e.get("attempt_id") and e["type"].split(".")[-1].upper() in STATE_COLOURS:
            ends[e["attempt_id"]] = parse_time(e["at"]) or end
    parts = [
        _axis(start, end, left, plot, 16 + row * (1 + len(attempts))),
        '<text x="0" y="19" class="attempt-label">queued</text>',
    ]
    waited_since: datetime | None = start
    for i, a in enumerate(attempts):
        y = 8 + (i + 1) * row
        begin = parse_time(a["created_at"])
        finish = parse_time(a.get("ended_at")) or (
            ends.get(a["id"]) if a["state"] not in ("CREATED", "LAUNCHING", "RUNNING") else now
        )
        if waited_since is not None and begin is not None:
            parts.append(_wait(waited_since, begin, x))
        waited_since = finish if a["state"] in ("PREEMPTED", "LOST", "FAILED") else None
        nodes = ", ".join(n["node"] for n in a.get("placement", {}).get("nodes", []))
        # where it resumed: the newest checkpoint an earlier attempt left (its own is where it got to)
        saved = [p["checkpoint_step"] for p in attempts[:i] if p.get("checkpoint_step") is not None]
        resumed = f" · resumed from step {max(saved)}" if saved else ""
        parts.append(
            f'<text x="0" y="{y + 15}" class="attempt-label">#{a["number"]} {_a(nodes)}{_a(resumed)}</text>'
        )
        x0, x1 = x(begin), max(x(finish), x(begin) + 2)
        lost = a.get("progress_lost_s")
        tip = f"attempt {a['number']} {a['state']} on {nodes}" + (
            f"; {lost:.0f} s of work lost" if lost else ""
        )
        parts.append(
            f'<rect class="attempt" data-attempt="{_a(a["id"])}" data-state="{_a(a["state"])}" x="{x0:.1f}" '
            f'y="{y}" width="{x1 - x0:.1f}" height="20" rx="3" '
            f'fill="{STATE_COLOURS.get(a["state"], "#999")}">'
            f"<title>{_a(tip)}</title></rect>"
        )
        started = parse_time(a.get("started_at"))
        if started is not None and x(started) > x0 + 1:  # placed, its workers not running yet
            parts.append(
                f'<rect class="launching" x="{x0:.1f}" y="{y}" width="{x(started) - x0:.1f}" height="20" '
                f'rx="3" fill="{STATE_COLOURS["LAUNCHING"]}"><title>launching until '
                f"{started:%H:%M:%S}</title></rect>"
            )
        if a["state"] not in ("RUNNING", "LAUNCHING", "CREATED"):
            # after the bar when there is room, else inside its end, in white
            outside = x1 + 4 + 7 * len(a["state"]) < width
            where = (
                f'x="{x1 + 4:.1f}" style="font-weight:600"'
                if outside
                else f'x="{x1 - 4:.1f}" text-anchor="end" style="font-weight:600;fill:white"'
            )
            parts.append(
                f'<text class="end-label" data-state="{_a(a["state"])}" {where} y="{y + 15}">'
                f"{_a(a['state'])}</text>"
            )
        drawn_steps: set[object] = set()  # heartbeats repeat the newest checkpoint: one mark per step
        for e in events:
            if e.get("attempt_id") != a["id"]:
                continue
            ex = x(parse_time(e["at"]))
            data = e.get("data") or {}
            if e["type"] == "attempt.checkpointed" and data.get("step") not in drawn_steps:
                drawn_steps.add(data.get("step"))
                parts.append(
                    f'<path class="checkpoint" d="M{ex:.1f},{y + 4} l5,6 l-5,6 l-5,-6 z" fill="white" '
                    f'stroke="#222"><title>checkpoint at step {_a(data.get("step"))}</title></path>'
                )
            elif e["type"] == "attempt.stop_requested":
                parts.append(
                    f'<path class="stop-notice" data-kind="{_a(data.get("kind", ""))}" '
                    f'd="M{ex - 6:.1f},{y - 2} h12 l-6,9 z" fill="#d62728"><title>'
                    f"{_a(data.get('kind', 'stop'))} notice: {_a(data.get('why', ''))}</title></path>"
                )
    if waited_since is not None and job["state"] == "PENDING":
        parts.append(_wait(waited_since, now, x))
    height = 40 + row * (1 + len(attempts))
    return (
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'
    )


def _wait(since: datetime, until: datetime, x: Callable[[datetime], float]) -> str:
    seconds = max(0.0, (until - since).total_seconds())
    return (
        f'<rect class="wait" x="{x(since):.1f}" y="13" width="{max(2.0, x(until) - x(since)):.1f}" '
        f'height="8" fill="#c7c7c7"><title>waited {seconds:.0f} s in the queue</title></rect>'
    )


def _axis(start: datetime, end: datetime, left: int, plot: int, y: int) -> str:
    ticks = []
    for k in range(5):
        at = start + (end - start) * (k / 4)
        tx = left + plot * k / 4
        ticks.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="0" y2="{y}" stroke="#eee"/>'
            f'<text x="{tx:.1f}" y="{y + 14}" class="tick" text-anchor="middle">{at:%H:%M:%S}</text>'
        )
    return "".join(ticks)


# -- charts -------------------------------------------------------------------------------------------


def line_chart(
    title: str,
    lines: Mapping[str, Sequence[tuple[datetime, float | None]]],
    *,
    unit: str = "",
    width: int = 520,
    height: int = 200,
    percent: bool = False,
    empty: str = "no data yet",
    team_colours: Mapping[str, str] | None = None,
) -> str:
    """One polyline per label over shared time; gaps (None) break a line; "total" dashed, on top.
    The y axis starts at 0."""
    left, top, bottom = 52, 24, 30
    plot_w, plot_h = width - left - 10, height - top - bottom
    points = [(t, v) for series in lines.values() for t, v in series]
    values = [v for _, v in points if v is not None]
    name = f"chart-{zlib.crc32(title.encode()):08x}"
    header = (
        f'<svg class="chart" data-chart="{_a(title)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}"><text x="0" y="14" class="chart-title">'
        f"{_a(title)}</text>"
    )
    if not points:
        return header + f'<text x="{left}" y="{top + 20}" class="empty">{_a(empty)}</text></svg>'
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    span = max(1.0, (t1 - t0).total_seconds())
    top_value = max(values, default=0.0) or 1.0
    if percent:
        top_value = max(1.0, top_value)

    def xy(t: datetime, v: float) -> str:
        return (
            f"{left + plot_w * (t - t0).total_seconds() / span:.1f},{top + plot_h * (1 - v / top_value):.1f}"
        )

    fmt = (lambda v: f"{v * 100:.0f}%") if percent else (lambda v: f"{v:.3g}{unit}")
    parts = [
        header,
        f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" class="tick">{fmt(top_value)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="tick">{fmt(0.0)}</text>',
        f'<text x="{left}" y="{height - 8}" class="tick">{t0:%m-%d %H:%M}</text>',
        f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end" class="tick">{t1:%m-%d %H:%M}</text>',
    ]
    ordered = sorted(lines.items(), key=lambda item: item[0] == "total")  # the total drawn last
    for k, (label, series) in enumerate(ordered):
        stroke = "#222" if label == "total" else colour(label, team_colours)
        dash = ' stroke-dasharray="5 3"' if label == "total" else ""
        runs: list[list[str]] = [[]]
        for t, v in series:
            if v is None:
                runs.append([])
            else:
                runs[-1].append(xy(t, v))
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{stroke}"/>')
            elif run:
                parts.append(
                    f'<polyline class="{name}" data-line="{_a(label)}" points="{" ".join(run)}" fill="none" '
                    f'stroke="{stroke}" stroke-width="{2 if label == "total" else 1.5}"{dash}/>'
                )
        parts.append(
            f'<text x="{left + 8 + k * 90}" y="{top + 8}" class="legend" style="fill:{stroke}">'
            f"{_a(label)}</text>"
        )
    return "".join(parts) + "</svg>"
