"""The page's HTML, server-rendered from the API's JSON: the queue and the fleet, a job, the figures.

Pure functions of what the client returned (no I/O); `app.py` fetches and serves. Every string from
the API is escaped. A page is a layout around a `<main>` that the page's script refreshes in place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from gpuyard_provider.narration import Story, attempt_of
from gpuyard_provider.ui import svg

FIGURES = (  # (field of a series point, chart title, shown as a share)
    ("utilization", "GPU utilization", True),
    ("goodput", "goodput (useful GPU time / GPU time leased)", True),
    ("queue_wait_p50_s", "queue wait p50 (s)", False),
    ("queue_wait_p99_s", "queue wait p99 (s)", False),
    ("resume_success_share", "resume success share", True),
    ("lost_gpu_hours", "progress lost (GPU-h): steps made and not kept", False),
    ("cost_per_job", "cost per finished job", False),
    ("idle_cost", "idle cost (free GPUs)", False),
)


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def layout(base: str, title: str, body: str, who: Mapping[str, Any] | None, refresh_s: int = 5) -> str:
    nav = ""
    if who is not None:
        airflow_user = who.get("airflow_user")  # signed in through Airflow: nothing to sign out of here
        as_whom = (
            f' · Airflow user <span class="airflow-user">{e(airflow_user)}</span>' if airflow_user else ""
        )
        leave = (
            f'<a href="{base}/sign-in">use a token</a>'
            if airflow_user
            else f'<a href="{base}/sign-out">sign out</a>'
        )
        nav = (
            f'<nav><a href="{base}/">queue &amp; fleet</a><a href="{base}/figures">figures</a>'
            f'<span class="who">team {e(who.get("team"))} · {e(who.get("role"))}{as_whom}</span>'
            f'<label><input type="checkbox" id="live" checked> live</label>'
            f"{leave}</nav>"
        )
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>gpuyard · {e(title)}</title>"
        f'<link rel="stylesheet" href="{base}/static/page.css"></head><body>'
        f"<header><h1>gpuyard</h1>{nav}</header>"
        f'<main id="content" data-refresh="{refresh_s}">{body}</main>'
        f'<script src="{base}/static/page.js"></script></body></html>'
    )


def sign_in(base: str, error: str | None, airflow: Mapping[str, str] | None = None) -> str:
    """The token form; `airflow`, inside Airflow: the Airflow user's sign-in (`team`, `role`) or why
    they have none (`notice`)."""
    problem = f'<p class="error">{e(error)}</p>' if error else ""
    through = ""
    if airflow and airflow.get("notice"):
        through = f'<p class="notice" data-airflow-user="{e(airflow["user"])}">{e(airflow["notice"])}</p>'
    elif airflow:
        through = (
            f'<p class="through" data-airflow-user="{e(airflow["user"])}">Signed in through Airflow as '
            f"{e(airflow['user'])}: team {e(airflow['team'])}, role {e(airflow['role'])}. "
            f'<a href="{base}/">Open the page</a>, or sign in with a token to see what it sees.</p>'
        )
    return (
        f"{through}<h2>Sign in with your gpuyard token</h2>"
        "<p>The page shows what this token may see: a member sees its team's jobs and figures, a platform "
        "admin every team's. Make one with <code>gpuyard token create --team TEAM</code>; an embedded "
        "instance keeps its admin token in <code>$GPUYARD_HOME/admin.token</code>.</p>"
        f'{problem}<form method="post" action="{base}/sign-in">'
        '<input type="password" name="token" placeholder="gy_..." autocomplete="off" required size="60">'
        '<button type="submit">sign in</button></form>'
    )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def dashboard(
    base: str,
    queue: Mapping[str, Any],
    fleet: Sequence[Mapping[str, Any]],
    filters: Mapping[str, Any],
    recent: Sequence[Mapping[str, Any]] = (),
) -> str:
    team_colours = svg.colours(t["name"] for t in queue["teams"])
    return (
        '<section id="queue"><h2>Queue</h2>'
        + _teams(queue["teams"], team_colours)
        + _filters(base, queue, filters)
        + _queue_table(base, queue, filters)
        + '</section><section id="fleet"><h2>Fleet</h2>'
        + _fleet_legend(fleet)
        + svg.fleet_grid(fleet, team_colours=team_colours)
        + '</section><section id="recent"><h2>Recent jobs</h2>'
        + _recent(base, recent)
        + "</section>"
    )


def _recent(base: str, jobs: Sequence[Mapping[str, Any]]) -> str:
    """The newest jobs in any state: where a finished job (and its timeline) is found."""
    rows = "".join(
        f'<tr class="recent" data-job="{e(j["id"])}">'
        f'<td><a href="{base}/jobs/{quote(j["id"])}">{e(j["name"])}</a>'
        f'<div class="id">{e(j["id"])}</div></td><td>{e(j["team"])}</td>'
        f'<td class="state-{e(j["state"])}">{e(j["state"])}</td><td>{j["attempt_count"]}</td>'
        f"<td>{e(_short(j.get('updated_at')))}</td><td>{e(j.get('reason'))}</td></tr>"
        for j in jobs
    )
    return (
        '<table class="recent"><tr><th>job</th><th>team</th><th>state</th><th>attempts</th><th>changed</th>'
        f"<th>last word</th></tr>{rows}</table>"
    )


def _teams(teams: Sequence[Mapping[str, Any]], team_colours: Mapping[str, str]) -> str:
    rows = "".join(
        f'<tr data-team="{e(t["name"])}">'
        f'<td><span class="swatch" style="background:{svg.colour(t["name"], team_colours)}">'
        f"</span>{e(t['name'])}</td><td>{t['used_gpus']} / {t['gpu_quota']}</td>"
        f"<td>{_use_bar(t['used_gpus'], t['gpu_quota'], t['borrowed_gpus'])}</td>"
        f"<td>{t['borrowed_gpus']}</td><td>{e(t['cohort'] or '-')}</td><td>{t['weight']:g}</td>"
        f"<td>{t['waiting_jobs']}</td><td>{t['waiting_gpus']}</td></tr>"
        for t in teams
    )
    return (
        '<table class="teams"><tr><th>team</th><th>GPUs used / quota</th><th></th><th>borrowed</th>'
        f"<th>cohort</th><th>weight</th><th>jobs waiting</th><th>GPUs waiting</th></tr>{rows}</table>"
    )


def _use_bar(used: int, quota: int, borrowed: int) -> str:
    scale = max(quota, used, 1)
    own = min(used - borrowed, quota)
    return (
        f'<svg width="120" height="10"><rect width="120" height="10" fill="#eee"/>'
        f'<rect width="{120 * own / scale:.1f}" height="10" fill="#4e79a7"/>'
        f'<rect x="{120 * own / scale:.1f}" width="{120 * borrowed / scale:.1f}" height="10" fill="#f28e2b"/>'
        f'<line x1="{120 * quota / scale:.1f}" x2="{120 * quota / scale:.1f}" y1="0" y2="10" stroke="#222"/>'
        f"<title>{used} GPUs in use ({borrowed} borrowed) of a quota of {quota}</title></svg>"
    )


def _link(base: str, filters: Mapping[str, Any], **changes: object) -> str:
    merged = {k: v for k, v in {**filters, **changes}.items() if v not in (None, "", 0)}
    return f"{base}/?{urlencode(merged)}" if merged else f"{base}/"


def _filters(base: str, queue: Mapping[str, Any], filters: Mapping[str, Any]) -> str:
    counts = queue["reasons"]
    chips = [
        f'<a class="chip{" on" if not filters.get("reason") else ""}" '
        f'href="{_link(base, filters, reason=None, offset=None)}">all {sum(counts.values())}</a>'
    ]
    for code in sorted(counts):
        if counts[code]:
            on = " on" if filters.get("reason") == code else ""
            chips.append(
                f'<a class="chip reason-{code}{on}" data-reason="{code}" '
                f'href="{_link(base, filters, reason=code, offset=None)}">{code} {counts[code]}</a>'
            )
    teams = [t["name"] for t in queue["teams"]]
    options = "".join(
        f'<option value="{e(t)}"{" selected" if filters.get("team") == t else ""}>{e(t)}</option>'
        for t in teams
    )
    team_form = (
        f'<form method="get" action="{base}/" class="team-filter">'
        '<select name="team" onchange="this.form.submit()">'
        f'<option value="">every team</option>{options}</select></form>'
        if len(teams) > 1
        else ""
    )
    return f'<div class="filters">{"".join(chips)}{team_form}</div>'


def _queue_table(base: str, queue: Mapping[str, Any], filters: Mapping[str, Any]) -> str:
    rows = "".join(
        f'<tr class="job" data-job="{e(j["id"])}">'
        f'<td><a href="{base}/jobs/{quote(j["id"])}">{e(j["name"])}</a>'
        f'<div class="id">{e(j["id"])}</div></td><td>{e(j["team"])}</td><td>{e(j["priority"])}</td>'
        f"<td>{j['gpus']}</td><td>{_age(j['age_s'])}</td><td>{j['attempts']}</td>"
        f'<td><span class="reason reason-{e(j["reason"])}">{e(j["reason"])}</span> '
        f"{e(j['reason_text'])}</td></tr>"
        for j in queue["items"]
    )
    offset, shown, total = queue["offset"], len(queue["items"]), queue["total"]
    limit = int(filters.get("limit") or 50)
    pager = f"<span>{offset + 1 if shown else 0} to {offset + shown} of {total} waiting</span>"
    if offset > 0:
        pager = f'<a href="{_link(base, filters, offset=max(0, offset - limit))}">newer ←</a> ' + pager
    if offset + shown < total:
        pager += f' <a class="next" href="{_link(base, filters, offset=offset + limit)}">→ more</a>'
    return (
        f'<p class="policy">in the order the scheduler ({e(queue["policy"])}) looks at them: priority first, '
        f"then age; reasons as its cycle states them, as of {e(_short(queue.get('as_of')))}</p>"
        '<table class="queue"><tr><th>job</th><th>team</th><th>priority</th><th>GPUs</th><th>age</th>'
        f'<th>attempts</th><th>why it waits</th></tr>{rows}</table><div class="pager">{pager}</div>'
    )


def _fleet_legend(fleet: Sequence[Mapping[str, Any]]) -> str:
    total = sum(n["gpus"] for n in fleet)
    free = sum(n["free_gpus"] for n in fleet)
    unhealthy = sum(n["gpus"] for n in fleet if svg.unhealthy(n))
    return (
        f'<p class="legend"><span class="swatch" style="background:{svg.FREE}"></span>free {free} '
        f'<span class="swatch" style="background:{svg.OTHERS}"></span>leased {total - free} (coloured: your '
        f'teams\' jobs) <span class="swatch" style="border:2px solid {svg.UNHEALTHY}"></span>unhealthy '
        f'{unhealthy} <span class="swatch" style="border:1px dashed #888"></span>tainted (spot, reserved) '
        f"· {total} GPUs on {len(fleet)} nodes</p>"
    )


# -- a job --------------------------------------------------------------------------------------------


def job_page(
    base: str,
    job: Mapping[str, Any],
    now: datetime,
    logs: tuple[int | None, Sequence[str] | None],
    links: Mapping[str, str],
    waiting: Mapping[str, Any] | None = None,
) -> str:
    link_html = "".join(
        f'<a class="out" data-link="{e(name)}" href="{e(url)}" target="_top">{e(name)}</a>'
        for name, url in links.items()
    )
    interrupted = [a for a in job.get("attempts") or [] if a["state"] in ("PREEMPTED", "LOST")]
    lost_s = sum((a.get("progress_lost_s") or 0.0) * _gpus(a) for a in interrupted)
    header = (
        f'<h2>{e(job["name"])} <span class="state state-{e(job["state"])}">{e(job["state"])}</span></h2>'
        f'<p class="id">{e(job["id"])} · team {e(job["team"])} · '
        f"{len(job.get('attempts') or [])} attempt(s), "
        f"{len(interrupted)} interrupted, {lost_s / 3600:.3f} GPU-h lost"
        + (f" · {e(job['reason'])}" if job.get("reason") else "")
        + f'</p><p class="links">{link_html}</p>'
    )
    if waiting is not None:
        header += (
            f'<p class="waiting">waits: <span class="reason reason-{e(waiting["reason"])}">'
            f"{e(waiting['reason'])}</span> {e(waiting['reason_text'])}</p>"
        )
    return (
        header
        + f'<section id="timeline"><h3>Attempts</h3>{svg.timeline(job, now)}{_attempts(job)}</section>'
        + f'<section id="story"><h3>Events</h3>{_story(job)}</section>'
        + _logs(base, job, *logs)
        + '<section id="spec"><details><summary>spec</summary><pre>'
        + e(json.dumps(job["spec"], indent=2))
        + "</pre></details></section>"
    )


def _gpus(attempt: Mapping[str, Any]) -> int:
    return sum(len(n["gpus"]) for n in attempt.get("placement", {}).get("nodes", []))


def _attempts(job: Mapping[str, Any]) -> str:
    rows = "".join(
        f'<tr data-attempt="{e(a["id"])}"><td>{a["number"]}</td>'
        f'<td class="state-{e(a["state"])}">{e(a["state"])}'
        f"</td><td>{e(', '.join(n['node'] for n in a.get('placement', {}).get('nodes', [])))}</td>"
        f"<td>{e(_short(a.get('started_at')))}</td><td>{e(_short(a.get('ended_at')))}</td>"
        f"<td>{e(a.get('step'))}</td><td>{e(a.get('checkpoint_step'))}</td>"
        f"<td>{_seconds(a.get('progress_lost_s'))}</td>"
        f"<td>{e(a.get('reason'))}</td></tr>"
        for a in job.get("attempts") or []
    )
    return (
        '<table class="attempts"><tr><th>#</th><th>state</th><th>nodes</th><th>started</th><th>ended</th>'
        f"<th>step</th><th>checkpoint step</th><th>lost s</th><th>reason</th></tr>{rows}</table>"
    )


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _short(value: str | None) -> str:
    parsed = svg.parse_time(value)
    return f"{parsed:%H:%M:%S}" if parsed else ""


def _story(job: Mapping[str, Any]) -> str:
    story = Story()
    lines = []
    for event in job.get("events") or []:
        line = story.tell(event, attempt_of(job, event.get("attempt_id")))
        if line:
            lines.append(
                f'<li data-event="{e(event["type"])}">'
                f"<time>{e(_short(event.get('at')))}</time> {e(line)}</li>"
            )
    return f'<ol class="story">{"".join(lines)}</ol>'


def _logs(base: str, job: Mapping[str, Any], shown: int | None, logs: Sequence[str] | None) -> str:
    """The last lines of attempt `shown`, with a link to each other attempt's."""
    if logs is None:
        return ""
    others = " ".join(
        f'<a href="{base}/jobs/{quote(job["id"])}?attempt={a["number"]}">attempt {a["number"]}</a>'
        for a in job.get("attempts") or []
        if a["number"] != shown
    )
    body = e("\n".join(logs)) if logs else "(no output yet)"
    return (
        f'<section id="logs"><h3>Logs of attempt {shown} <span class="other-logs">{others}</span></h3>'
        f'<pre class="logs" data-attempt="{shown}">{body}</pre></section>'
    )


# -- figures ------------------------------------------------------------------------------------------


def figures(base: str, data: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    windows = "".join(
        f'<a class="chip{" on" if float(data["hours"]) == h else ""}" '
        f'href="{base}/figures?hours={h}">{label}</a>'
        for h, label in ((1.0, "1 h"), (6.0, "6 h"), (24.0, "24 h"), (168.0, "7 d"))
    )
    charts = []
    team_colours = svg.colours(data["teams"])
    for field, title, share in FIGURES:
        lines = {"total": _points(data["total"], field)}
        if field != "idle_cost" and len(data["teams"]) > 1:
            lines |= {team: _points(points, field) for team, points in data["teams"].items()}
        if all(v is None for series in lines.values() for _, v in series):
            lines = {}
        empty = "for platform admins: idle GPUs belong to no team" if field == "idle_cost" else "no data yet"
        charts.append(svg.line_chart(title, lines, percent=share, empty=empty, team_colours=team_colours))
    return (
        f'<div class="filters">{windows}</div>{_summary(summary)}<div class="charts">{"".join(charts)}</div>'
    )


def _points(points: Sequence[Mapping[str, Any]], field: str) -> list[tuple[datetime, float | None]]:
    return [(svg.parse_time(p["end"]), p[field]) for p in points]  # type: ignore[misc]


def _summary(summary: Mapping[str, Any]) -> str:
    def share(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.1f}%"

    def num(v: float | None, unit: str = "") -> str:
        return "-" if v is None else f"{v:.3g}{unit}"

    cells = (
        ("goodput", share(summary.get("goodput"))),
        ("GPU-h leased", num(summary.get("leased_gpu_hours"))),
        ("GPU-h lost", num(summary.get("lost_gpu_hours"))),
        ("wait p50", num(summary.get("queue_wait_p50_s"), " s")),
        ("wait p99", num(summary.get("queue_wait_p99_s"), " s")),
        ("resumes", str(summary.get("resumes", 0))),
        ("resume success", share(summary.get("resume_success_share"))),
        ("cost per job", num(summary.get("cost_per_finished_job"))),
    )
    return (
        '<div class="summary">'
        + "".join(f'<div><span>{e(k)}</span><b data-figure="{e(k)}">{e(v)}</b></div>' for k, v in cells)
        + "</div>"
    )
