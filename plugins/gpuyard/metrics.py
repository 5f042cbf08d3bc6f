"""Prometheus metrics of the control plane. Gauges over stored state are computed at scrape time.

`/metrics` answers without a token, so it carries platform-wide figures only: no series is labelled by
team (per-team figures are in `/v1/metrics/summary`, scoped to the caller).

`registry` holds what this process counts (requests, passes, placements, events relayed). With
`PROMETHEUS_MULTIPROC_DIR` set (`gpuyard api` sets it for its worker processes) those values live in
files there and a scrape of any worker sums every worker's (`latest`). `collectors` holds the gauges
read from the store at scrape time, which every process reports as the store says.
Names follow Prometheus conventions: a counter `x` is exposed as `x_total`, seconds end in `_seconds`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
registry = CollectorRegistry()
# No auto_describe: it would run the collectors (queries over the store) at every registration.
collectors = CollectorRegistry(auto_describe=False)

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

# The outbox relay (relay.py).
relay_batches = Counter("gpuyard_relay_batches", "Batches of events published", registry=registry)
relay_failures = Counter(
    "gpuyard_relay_failures", "Relay rounds that failed (bus or database away)", registry=registry
)
relay_lag = Gauge(
    "gpuyard_relay_lag_seconds",
    "Age of the oldest event of the last batch when it was published (0: nothing waited)",
    registry=registry,
)
relay_loop = Gauge(
    "gpuyard_relay_loop_timestamp_seconds", "When the relay's loop last went round", registry=registry
)

# The scheduler (scheduler/service.py). Passes are the pass histogram's _count.
scheduler_pass = Histogram(
    "gpuyard_scheduler_pass_seconds",
    "Duration of a scheduling pass (observe, renew, stops, reap, cycle, launch)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=registry,
)
scheduler_pass_failures = Counter(
    "gpuyard_scheduler_pass_failures", "Passes that raised (retried next pass)", registry=registry
)
scheduler_placements = Counter(
    "gpuyard_scheduler_placements", "Attempts reserved and handed to the launcher", registry=registry
)
scheduler_evictions = Counter(
    "gpuyard_scheduler_evictions", "Attempts asked to stop to make room (preemption)", registry=registry
)
scheduler_waiting = Gauge(
    "gpuyard_scheduler_waiting_jobs",
    "Jobs the last cycle left waiting, by reason (quota, no-room, reservation, other)",
    ["reason"],
    registry=registry,
)
scheduler_reports = Counter(
    "gpuyard_scheduler_reports_applied",
    "Launcher reports recorded in the store, by outcome",
    ["outcome"],
    registry=registry,
)
scheduler_leases_renewed = Counter(
    "gpuyard_scheduler_leases_renewed",
    "Leases renewed for workers the launcher sees alive",
    registry=registry,
)
scheduler_leases_reaped = Counter(
    "gpuyard_scheduler_leases_reaped", "Attempts found LOST because their lease expired", registry=registry
)
scheduler_leader = Gauge("gpuyard_scheduler_leader", "1 while this replica leads, else 0", registry=registry)
scheduler_loop = Gauge(
    "gpuyard_scheduler_loop_timestamp_seconds", "When the scheduler's loop last went round", registry=registry
)


def latest() -> bytes:
    """The text a scrape gets: this process's figures, or every worker's summed (multiprocess mode),
    then the gauges read from the store."""
    own = registry
    if os.environ.get(MULTIPROC_DIR):
        own = CollectorRegistry()
        MultiProcessCollector(own)
    return generate_latest(own) + generate_latest(collectors)


def exposed_names(*sources: CollectorRegistry | Collector) -> set[str]:
    """Every series name the sources expose (a counter `x` as `x_total`, a histogram with its
    `_bucket`, `_sum` and `_count`). A registry is collected (this process's own figures); a collector
    that reads the store is asked for its description only."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for source in sources:
        describe = getattr(source, "describe", None)
        families: Iterable[Metric] = (
            source.collect() if isinstance(source, CollectorRegistry) or describe is None else describe()
        )
        for family in families:
            names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


class JobStateCollector(Collector):
    """`gpuyard_jobs{state}` read from the store when scraped, so every replica reports the truth."""

    def __init__(self, count_by_state: Callable[[], dict[str, int]]):
        self.count_by_state = count_by_state

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("gpuyard_jobs", "Jobs by state", labels=["state"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        (family,) = self.describe()
        try:
            counts = self.count_by_state()
        except Exception:  # a scrape must not fail because the database is down; /readyz reports that
            counts = {}
        for state, count in sorted(counts.items()):
            family.add_metric([state], count)
        yield family


# The platform summary's figures (docs/metrics.md defines each): (series name, help, attribute).
PLATFORM_GAUGES = (
    ("gpuyard_goodput_ratio", "Useful GPU time / leased GPU time", "goodput"),
    ("gpuyard_leased_gpu_hours", "GPU-hours leased in the window", "leased_gpu_hours"),
    ("gpuyard_useful_gpu_hours", "GPU-hours of training steps that were kept", "useful_gpu_hours"),
    ("gpuyard_lost_progress_gpu_hours", "GPU-hours of training steps made and not kept", "lost_gpu_hours"),
    ("gpuyard_queue_wait_p50_seconds", "Median wait from submit to first attempt", "queue_wait_p50_s"),
    ("gpuyard_queue_wait_p99_seconds", "p99 wait from submit to first attempt", "queue_wait_p99_s"),
    ("gpuyard_resume_success_ratio", "Resumes that restored and made a new step", "resume_success_share"),
    ("gpuyard_cost", "GPU-hours x price in the window", "cost_total"),
)


class PlatformCollector(Collector):
    """The platform summary (goodput, waits, cost, ...) as gauges; `summary` may answer from a cache."""

    def __init__(self, summary: Callable[[], Any]):
        self.summary = summary

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, help_text, _ in PLATFORM_GAUGES:
            yield GaugeMetricFamily(name, help_text)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            s = self.summary()
        except Exception:  # see JobStateCollector
            return
        for name, help_text, attribute in PLATFORM_GAUGES:
            if (value := getattr(s, attribute)) is not None:
                yield GaugeMetricFamily(name, help_text, value=value)


class OutboxCollector(Collector):
    """`gpuyard_outbox_backlog`: events not yet published, counted when scraped (the relay's)."""

    def __init__(self, count_unpublished: Callable[[], int]):
        self.count_unpublished = count_unpublished

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("gpuyard_outbox_backlog", "Outbox events not yet published")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            count = self.count_unpublished()
        except Exception:  # see JobStateCollector
            return
        yield GaugeMetricFamily("gpuyard_outbox_backlog", "Outbox events not yet published", value=count)
