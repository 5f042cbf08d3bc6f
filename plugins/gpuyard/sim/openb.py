"""Read the Alibaba OpenB GPU cluster trace (clusterdata `cluster-trace-gpu-v2023`): its pods as jobs,
its node list as a heterogeneous fleet.

Pods (`name, num_gpu, gpu_milli, gpu_spec, qos, creation_time, deletion_time, scheduled_time, ...`,
times in seconds from the trace's start): a pod asking whole GPUs becomes a job of `num_gpu` GPUs that
may run only on the GPU models of its `gpu_spec` (`V100M16|V100M32`; empty or `nan`: any), submitted
at `creation_time` and running `deletion_time - scheduled_time` seconds (a pod still running at the
end of the trace counts until then). The QoS class (LS, BE, Burstable, Guaranteed) is the team: the
unit of quota and fair share. Not replayed, and counted:
- pods without GPUs (the GPU scheduler does not place them);
- pods never scheduled in the trace (no `scheduled_time`: their run time is unknown);
- fractional requests (`num_gpu` 1 with `gpu_milli` under 1000: GPU sharing, which gpuyard does not
  do) under `fractional="skip"`; under `fractional="whole"` they are placed on one whole GPU, and only
  their share of it counts as kept work in goodput.

`speedup` divides the submit times (never the run times): the published pods are a sample of the
cluster's load (about 1% of its GPU-time at the real pace), so a replay raises the offered load to
make GPUs contended, as the trace's authors replay it with inflated load.

Nodes (`sn, cpu_milli, memory_mib, gpu, model`): one node per row, its own fast domain (the trace has
no topology, and no pod spans nodes), one price for every model (the trace has none). Any file in
these formats and any window of it can be replayed; a bad row stops the run naming row and column.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpuyard.domain.fleet import Fleet, Node
from gpuyard.sim.fleet_builder import ON_DEMAND_PRICE
from gpuyard.sim.trace import TraceError, TraceJob, csv_rows

POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")
NODE_COLUMNS = ("sn", "gpu", "model")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the trace's seconds, read as POSIX time
FRACTIONAL = ("whole", "skip")
NO_SPEC = ("", "nan", "none")


@dataclass
class PodCounts:
    """What the reader did with the pods of the window."""

    jobs: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # why -> pods
    fractional_placed_whole: int = 0


def _rows(path: Path, required: tuple[str, ...], what: str) -> Iterator[tuple[int, dict[str, str]]]:
    return csv_rows(path, required, what, f"an OpenB {what} has {list(required)}")


def _maybe_number(
    path: Path, line: int, row: dict[str, str], column: str, *, whole: bool = False
) -> float | None:
    """The column's value, a finite number >= 0 (a whole one if `whole`), or None when it is blank."""
    raw = (row.get(column) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (whole and not value.is_integer()):
        expected = "a whole number >= 0" if whole else "a number >= 0"
        raise TraceError(f"{path}: row {line}, column {column!r}: expected {expected}, got {raw!r}")
    return value


def _number(path: Path, line: int, row: dict[str, str], column: str, *, whole: bool = False) -> float:
    value = _maybe_number(path, line, row, column, whole=whole)
    if value is None:
        raise TraceError(f"{path}: row {line}, column {column!r}: expected a number >= 0, got ''")
    return value


def read_pods(
    path: Path,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    speedup: float = 1.0,
    fractional: str = "whole",
) -> tuple[list[TraceJob], PodCounts]:
    """The GPU pods created in [start_s, end_s) (trace seconds), as jobs ordered by submit time."""
    if fractional not in FRACTIONAL:
        raise ValueError(f"fractional must be one of {FRACTIONAL}, got {fractional!r}")
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    counts, jobs = PodCounts(), []
    seen: dict[str, int] = {}  # pod name -> its row
    for line, row in _rows(path, POD_COLUMNS, "pod list"):
        created = _number(path, line, row, "creation_time")
        deleted = _number(path, line, row, "deletion_time")
        scheduled = _maybe_number(path, line, row, "scheduled_time")
        gpus = _number(path, line, row, "num_gpu", whole=True)
        milli = _number(path, line, row, "gpu_milli")
        name = (row.get("name") or "").strip()
        if not name or name in seen:
            problem = (
                "a pod name" if not name else f"a name no other row has ({name!r} is on row {seen[name]})"
            )
            raise TraceError(f"{path}: row {line}, column 'name': expected {problem}, got {name!r}")
        seen[name] = line
        if scheduled is not None and deleted < scheduled:
            raise TraceError(
                f"{path}: row {line}, column 'deletion_time': expected >= scheduled_time {scheduled:g}, "
                f"got {deleted:g}"
            )
        if (start_s is not None and created < start_s) or (end_s is not None and created >= end_s):
            continue
        if gpus == 0:
            counts.skipped["no GPU"] += 1
            continue
        if scheduled is None:
            counts.skipped["never scheduled in the trace"] += 1
            continue
        share = 1.0
        if gpus == 1 and milli < 1000:
            if fractional == "skip":
                counts.skipped["fractional GPU"] += 1
                continue
            share = max(milli, 1.0) / 1000
            counts.fractional_placed_whole += 1
        spec = (row.get("gpu_spec") or "").strip()
        models = (
            () if spec.lower() in NO_SPEC else tuple(sorted(m.strip() for m in spec.split("|") if m.strip()))
        )
        jobs.append(
            TraceJob(
                id=name,
                team=(row.get("qos") or "").strip() or "openb",
                submitted_at=EPOCH + timedelta(seconds=created / speedup),
                duration_s=deleted - scheduled,
                gpus=int(gpus),
                gpu_types=models,
                gpu_share=share,
            )
        )
    counts.jobs = len(jobs)
    jobs.sort(key=lambda j: (j.submitted_at, j.id))
    return jobs, counts


def read_nodes(path: Path, share: float = 1.0, price_per_gpu_hour: float = ON_DEMAND_PRICE) -> Fleet:
    """The GPU nodes of an OpenB node list, each its own domain; nodes without GPUs are left out.

    `share` < 1 keeps that share of the nodes of each (GPU model, GPUs per node) group, evenly spread
    over the list and at least one per group: a smaller fleet with the same mix.
    """
    if not 0 < share <= 1:
        raise ValueError(f"share must be within (0, 1], got {share}")
    nodes: list[Node] = []
    seen: dict[str, int] = {}  # node name -> its row
    for line, row in _rows(path, NODE_COLUMNS, "node list"):
        gpus = _number(path, line, row, "gpu", whole=True)
        if gpus == 0:
            continue
        name, model = (row.get("sn") or "").strip(), (row.get("model") or "").strip()
        if not name or name in seen:
            problem = (
                "a node name" if not name else f"a name no other row has ({name!r} is on row {seen[name]})"
            )
            raise TraceError(f"{path}: row {line}, column 'sn': expected {problem}, got {name!r}")
        seen[name] = line
        if not model or model.lower() == "nan":
            raise TraceError(f"{path}: row {line}, column 'model': expected a GPU model, got {model!r}")
        cpu = _maybe_number(path, line, row, "cpu_milli")
        memory = _maybe_number(path, line, row, "memory_mib")
        nodes.append(
            Node(
                name=name,
                site="openb",
                cluster="openb",
                domain=f"d{len(nodes):05d}",  # its own
                gpu_type=model,
                gpus=int(gpus),
                cpu=(cpu or 1000.0) / 1000,
                memory_gb=(memory or 1024.0) / 1024,
                price_per_gpu_hour=price_per_gpu_hour,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no node with GPUs")
    groups: dict[tuple[str, int], list[Node]] = {}
    for node in nodes:
        groups.setdefault((node.gpu_type, node.gpus), []).append(node)
    kept = {
        node.name
        for members in groups.values()
        for k, node in enumerate(members)
        if math.floor(k * share) != math.floor((k - 1) * share) or k == 0
    }
    return Fleet(nodes=tuple(node for node in nodes if node.name in kept))
