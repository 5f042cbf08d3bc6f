"""Prometheus metrics of the control plane. Gauges over stored state are computed at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

registry = CollectorRegistry(auto_describe=True)

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
jobs_submitted = Counter(
    "gpuyard_jobs_submitted", "Jobs accepted (new, not replays)", ["team"], registry=registry
)
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
