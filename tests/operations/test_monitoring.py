"""deploy/monitoring/: the alert rules and the Grafana dashboard name only series the code exports,
and every alert has its runbook in docs/operations.md, which lists every exported series."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuyard import metrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
# What PromQL spells that is not a series: keywords, and identifiers followed by "(" are functions.
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}
EXPORTED = metrics.exposed_names(
    metrics.registry,
    metrics.JobStateCollector(dict),
    metrics.PlatformCollector(object),
    metrics.OutboxCollector(int),
)


def series(expr: str) -> set[str]:
    """The series names an expression reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\boffset\s+\w+", "", expr)  # offsets
    expr = re.sub(r"(?<![\w:])\d[\w.]*", "", expr)  # numbers (0.99, 1e3, 5m)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()[:1]
        if match[0] not in KEYWORDS and following != "(":
            names.add(match[0])
    return names


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for group in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
        for rule in group["rules"]
    ]


def panel_targets() -> list[tuple[str, str]]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


def test_the_expression_reader_finds_series_and_only_series() -> None:
    expr = 'histogram_quantile(0.9, sum by (le) (rate(a_bucket{s=~"5.."}[5m]))) / on(x) b > 0 and c offset 1h'
    assert series(expr) == {"a_bucket", "b", "c"}


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_each_alert_reads_exported_series_and_has_a_runbook(rule: dict[str, Any]) -> None:
    names = series(rule["expr"])
    assert names and names <= EXPORTED, names - EXPORTED
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert re.fullmatch(r"\d+[smh]", rule["for"])
    anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
    assert anchor == rule["alert"].lower()
    assert f"### {rule['alert']}" in OPERATIONS  # GitHub's anchor of that heading is the lower-cased name


def test_the_alerts_cover_what_the_issue_asked() -> None:
    read = {name for rule in rules() for name in series(rule["expr"])}
    assert {
        "gpuyard_outbox_backlog",
        "gpuyard_scheduler_leader",
        "gpuyard_scheduler_leases_reaped_total",
    } <= read
    assert "gpuyard_goodput_ratio" in read


def test_the_dashboard_panels_read_exported_series() -> None:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    for title, expr in panel_targets():
        names = series(expr)
        assert names and names <= EXPORTED, (title, names - EXPORTED)


def test_the_operations_guide_lists_every_exported_series() -> None:
    documented = set(re.findall(r"`(gpuyard_[a-z0-9_]+)`", OPERATIONS))
    histograms = {name.removesuffix("_bucket") for name in EXPORTED if name.endswith("_bucket")}
    families = {
        name for name in EXPORTED if not any(name.startswith(h + "_") for h in histograms)
    } | histograms
    assert families - documented == set()
