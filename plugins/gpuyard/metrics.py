"""Prometheus metrics of the control plane. Gauges over stored state are computed at scrape time.

`/metrics` answers without a token, so it carries platform-wide figures only: no series is labelled by
team (per-team figures are in `/v1/metrics/summary`, scoped to the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# No auto_describe: it would run the collectors below (queries over the store) at every registration.
registry = CollectorRegistry(auto_describe=False)

http_requests = Counter(
    "gpuyard_http_requests", "HTTP requests answered", ["method", "route", "status"], registry=registry
)
http_latency = Histogram(
    "gpuyard_http_request_seconds",
    "HTTP request latency",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=registry,
)
jobs_submitted = Counter("gpuyard_jobs_submitted", "Jobs accepted (new, not replays)", registry=registry)
events_published = Counter("gpuyard_outbox_events_published", "Outbox events published", registry=registry)


class JobStateCollector(Collector):
    """`gpuyard_jobs{state}` read from the store when scraped, so every replica reports the truth."""

    def __init__(self, count_by_state: Callable[[], dict[str, int]]):
        self.count_by_state = count_by_state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("gpuyard_jobs", "Jobs by state", labels=["state"])
        try:
            counts = self.count_by_state()
        except Exception:  # a scrape must not fail because the database is down; /readyz reports that
            counts = {}
        for state, count in sorted(counts.items()):
            family.add_metric([state], count)
        yield family


class PlatformCollector(Collector):
    """The platform summary (goodput, waits, cost, ...) as gauges; `summary` may answer from a cache."""

    def __init__(self, summary: Callable[[], Any]):
        self.summary = summary

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            s = self.summary()
        except Exception:  # see JobStateCollector
            return
        for name, help_text, value in (
            ("gpuyard_goodput_ratio", "GPU-seconds of kept progress / GPU-seconds leased", s.goodput),
            ("gpuyard_leased_gpu_hours", "GPU-hours leased in the window", s.leased_gpu_hours),
            (
                "gpuyard_lost_progress_gpu_hours",
                "GPU-hours of progress lost to interruptions",
                s.lost_gpu_hours,
            ),
            (
                "gpuyard_queue_wait_p50_seconds",
                "Median wait from submit to first attempt",
                s.queue_wait_p50_s,
            ),
            ("gpuyard_queue_wait_p99_seconds", "p99 wait from submit to first attempt", s.queue_wait_p99_s),
            ("gpuyard_resume_success_ratio", "Resumed attempts that started", s.resume_success_share),
            ("gpuyard_cost_total", "GPU-hours x price in the window", s.cost_total),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)
