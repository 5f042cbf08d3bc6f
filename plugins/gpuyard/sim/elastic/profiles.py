"""Application profiles of the Pollux (OSDI'21) simulator study: how long a step takes and what it is worth.

An application's folder holds what the study measured on real GPUs:
- `placements.csv` (`placement,local_bsz,step_time,sync_time`): step and gradient-sync seconds for each
  placement of up to 4 nodes (GPUs per node as digits, `22` = 2 nodes x 2 GPUs) at a few local batches;
- `scalability.csv` (`num_nodes,num_replicas,local_bsz,step_time,sync_time`): the same on 6 to 16 nodes;
- `validation-<batch>.csv` (`progress,...,grad_sqr,grad_var`): one row per epoch of training at that
  global batch: where the epoch ends (progress, in steps at the smallest batch) and the gradient's
  squared norm and variance during it, which set how much a step at a larger batch is worth.

Times follow the study's `applications.py` (`Application.get_throughput`): a measured placement is
interpolated linearly in the local batch; any other placement (5 nodes or more) linearly over node
count, GPU count and local batch among the measurements of both files (`_shape_times`). A batch or
placement outside what was measured is an error, never an extrapolation.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpuyard.sim.trace import TraceError, csv_rows

from training.efficiency import gain

Placement = tuple[int, ...]  # GPUs on each node the job holds
Times = tuple[float, float]  # (step_time, sync_time) in seconds

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "grad_sqr", "grad_var")
VALIDATION_NAME = re.compile(r"validation-(\d+)\.csv")
MEASURED_NODES = 16  # the study's cluster: placements on more nodes are read as on 16
EPS = 1e-8  # the study's ceilings subtract it, so that an exact quotient is not rounded up
# The study's own rules for two applications (its applications.py and simulator.py): yolov3 fits
# 8 examples per GPU; ncf always trains on 1 GPU at a global batch of 32768.
STUDY_MAX_LOCAL_BSZ = {"yolov3": 8}
STUDY_PINNED = {"ncf": (1, 32768)}


@dataclass(frozen=True)
class Series:
    """Times measured at increasing local batches: exact on a row, linear between neighbours."""

    local_bsz: tuple[int, ...]
    times: tuple[Times, ...]

    def at(self, local_bsz: float) -> Times | None:
        """None outside the measured batches."""
        i = bisect.bisect_left(self.local_bsz, local_bsz)
        if i == len(self.local_bsz):
            return None
        if self.local_bsz[i] == local_bsz:
            return self.times[i]
        if i == 0:
            return None
        w = (local_bsz - self.local_bsz[i - 1]) / (self.local_bsz[i] - self.local_bsz[i - 1])
        return _lerp(self.times[i - 1], self.times[i], w)


@dataclass(frozen=True)
class Curve:
    """Training at one global batch, one entry per epoch."""

    batch_size: int
    progress: tuple[float, ...]  # where each epoch ends
    grad_sqr: tuple[float, ...]
    grad_var: tuple[float, ...]


@dataclass(frozen=True, eq=False)
class Application:
    """One application's measurements and the study's rules for it; `load_application` reads it."""

    name: str
    curves: tuple[Curve, ...]  # by increasing batch size
    placements: dict[Placement, Series]  # by canonical placement (`canonical`)
    # num_nodes -> num_replicas -> times: placements.csv averaged per shape, and scalability.csv
    shapes: dict[int, dict[int, Series]]
    max_local_bsz: int  # the most examples one GPU computes at once; more are accumulated
    pinned: tuple[int, int] | None = None  # (GPUs, global batch) the job always trains at

    @property
    def init_batch_size(self) -> int:
        """The smallest measured batch: progress is counted in its steps."""
        return self.curves[0].batch_size

    @property
    def max_batch_size(self) -> int:
        return self.curves[-1].batch_size

    @property
    def epochs(self) -> int:
        return min(len(c.progress) for c in self.curves)

    def epoch_end(self, epoch: int) -> float:
        """Progress at which `epoch` (0-based) ends: the earliest over the curves, as in the study."""
        return min(c.progress[epoch] for c in self.curves)

    def times(self, placement: Placement, local_bsz: int) -> Times:
        """(step, sync) seconds of one step of `local_bsz` examples per GPU on `placement`."""
        key = canonical(placement)
        if key in self.placements:
            times = self.placements[key].at(local_bsz)
        else:
            times = _shape_times(self.shapes, min(len(key), MEASURED_NODES), sum(key), local_bsz)
        if times is None:
            raise ValueError(
                f"{self.name}: no measurements around placement {key} at local batch {local_bsz}"
            )
        return times

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during `epoch` at `batch_size`: linear between the measured batches."""
        sizes = [c.batch_size for c in self.curves]
        if not sizes[0] <= batch_size <= sizes[-1]:
            raise ValueError(f"{self.name}: batch {batch_size} outside the measured {sizes[0]}..{sizes[-1]}")
        i = bisect.bisect_left(sizes, batch_size)
        hi = self.curves[i]
        if hi.batch_size == batch_size:
            return hi.grad_sqr[epoch], hi.grad_var[epoch]
        lo = self.curves[i - 1]
        w = (batch_size - lo.batch_size) / (hi.batch_size - lo.batch_size)
        return _lerp((lo.grad_sqr[epoch], lo.grad_var[epoch]), (hi.grad_sqr[epoch], hi.grad_var[epoch]), w)

    def gain(self, batch_size: float, epoch: int) -> float:
        """Progress one step at `batch_size` makes during `epoch`, in steps at the initial batch.

        A step at `scale` times the initial batch is worth up to `scale` small steps, less where the
        gradient's noise (var) is small beside its signal (sqr): the study's statistical efficiency
        `gain / scale`, 1 at the initial batch (`training.efficiency.gain`, which the runtime's adaptive
        batch shares).
        """
        sqr, var = self.grad_stats(batch_size, epoch)
        return gain(batch_size / self.init_batch_size, sqr, var)

    def batch_split(self, num_replicas: int, batch_size: int) -> tuple[int, int]:
        """(atomic_bsz, accum_steps): how `num_replicas` GPUs compute a global `batch_size`, each
        accumulating `accum_steps` micro-batches of `atomic_bsz` before the one that syncs."""
        local_bsz = math.ceil(batch_size / num_replicas - EPS)
        accum_steps = math.ceil(local_bsz / self.max_local_bsz - EPS) - 1
        if num_replicas == 1 and batch_size > self.init_batch_size:
            # The study's jobs never take one GPU's large batch in one pass: the gradient noise is
            # estimated from the micro-batches, so there are at least two.
            accum_steps = max(accum_steps, 1)
        atomic_bsz = math.ceil(local_bsz / (accum_steps + 1) - EPS)
        # Rounding up must not take the batch past the largest one measured.
        return min(atomic_bsz, self.max_batch_size // (num_replicas * (accum_steps + 1))), accum_steps


def canonical(placement: Placement) -> Placement:
    """The placement's lexicographically smallest rotation, without empty nodes: how the study keys
    a placement (a ring of nodes has no first node)."""
    nodes = tuple(g for g in placement if g)
    return min((nodes[i:] + nodes[:i] for i in range(len(nodes))), default=())


def load_applications(root: Path) -> dict[str, Application]:
    """Every application folder under `root`, by name."""
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not folders:
        raise TraceError(f"{root}: no application folders (each holds placements.csv, scalability.csv, ...)")
    return {folder.name: load_application(folder) for folder in folders}


def load_application(folder: Path) -> Application:
    """One application's folder; the study's rules for it (`STUDY_*`) by the folder's name."""
    placements = _read_placements(folder / "placements.csv")
    shapes = _shapes(placements, _read_scalability(folder / "scalability.csv"))
    measured_max = max(series.local_bsz[-1] for series in placements.values())
    return Application(
        name=folder.name,
        curves=_read_curves(folder),
        placements=placements,
        shapes=shapes,
        max_local_bsz=STUDY_MAX_LOCAL_BSZ.get(folder.name, measured_max),
        pinned=STUDY_PINNED.get(folder.name),
    )


def _shape_times(
    shapes: dict[int, dict[int, Series]], nodes: int, replicas: int, local_bsz: int
) -> Times | None:
    """Linear between the two measured node counts around `nodes`, on the segment through
    (nodes, replicas) that stays within the GPU counts each of them measured, and within a node
    count linear between the measured GPU counts around. The study interpolates the same points on a
    Delaunay triangulation (scipy's LinearNDInterpolator); this layered form needs no triangulation
    and agrees with it within about 1% on the placements the study's Tiresias gives its workloads."""
    if nodes in shapes:
        return _replica_times(shapes[nodes], replicas, local_bsz)
    counts = sorted(shapes)
    i = bisect.bisect_left(counts, nodes)
    if i in (0, len(counts)):
        return None
    lo, hi = shapes[counts[i - 1]], shapes[counts[i]]
    w = (nodes - counts[i - 1]) / (counts[i] - counts[i - 1])
    lo_replicas = hi_replicas = float(replicas)
    if replicas < min(hi):  # too few GPUs for the larger node count: follow its fewest
        hi_replicas = min(hi)
        lo_replicas = (replicas - w * hi_replicas) / (1 - w)
    elif replicas > max(lo):  # too many for the smaller node count: follow its most
        lo_replicas = max(lo)
        hi_replicas = (replicas - (1 - w) * lo_replicas) / w
    a = _replica_times(lo, lo_replicas, local_bsz)
    b = _replica_times(hi, hi_replicas, local_bsz)
    return None if a is None or b is None else _lerp(a, b, w)


def _replica_times(by_replicas: dict[int, Series], replicas: float, local_bsz: int) -> Times | None:
    if replicas in by_replicas:
        return by_replicas[int(replicas)].at(local_bsz)
    counts = sorted(by_replicas)
    i = bisect.bisect_left(counts, replicas)
    if i in (0, len(counts)):
        return None
    a = by_replicas[counts[i - 1]].at(local_bsz)
    b = by_replicas[counts[i]].at(local_bsz)
    w = (replicas - counts[i - 1]) / (counts[i] - counts[i - 1])
    return None if a is None or b is None else _lerp(a, b, w)


def _shapes(
    placements: dict[Placement, Series], scalability: dict[tuple[int, int, int], Times]
) -> dict[int, dict[int, Series]]:
    """num_nodes -> num_replicas -> times: placements of one shape averaged, as the study does."""
    points: dict[tuple[int, int, int], list[Times]] = defaultdict(list)
    for placement, series in placements.items():
        for local_bsz, times in zip(series.local_bsz, series.times, strict=True):
            points[len(placement), sum(placement), local_bsz].append(times)
    for key, times in scalability.items():
        points[key].append(times)
    rows: dict[int, dict[int, list[tuple[int, Times]]]] = defaultdict(lambda: defaultdict(list))
    for (nodes, replicas, local_bsz), measured in points.items():
        mean = (sum(t[0] for t in measured) / len(measured), sum(t[1] for t in measured) / len(measured))
        rows[nodes][replicas].append((local_bsz, mean))
    return {n: {r: _series(measured) for r, measured in by_r.items()} for n, by_r in rows.items()}


def _series(points: list[tuple[int, Times]]) -> Series:
    points.sort()
    return Series(tuple(b for b, _ in points), tuple(t for _, t in points))


def _read_placements(path: Path) -> dict[Placement, Series]:
    has = f"a placements file has {list(PLACEMENT_COLUMNS)}"
    rows: dict[Placement, dict[int, Times]] = defaultdict(dict)
    for line, row in csv_rows(path, PLACEMENT_COLUMNS, "placements file", has):
        raw = (row.get("placement") or "").strip()
        if not raw.isdigit() or "0" in raw:
            raise row_error(path, line, "placement", "GPUs per node as digits 1-9, like 22", raw)
        placement = canonical(tuple(int(d) for d in raw))
        local_bsz = whole_number(path, line, row, "local_bsz")
        if local_bsz in rows[placement]:
            raise row_error(path, line, "local_bsz", f"one row per placement {raw} and batch", str(local_bsz))
        rows[placement][local_bsz] = _times(path, line, row)
    if not rows:
        raise TraceError(f"{path}: no rows")
    return {p: _series(list(by_bsz.items())) for p, by_bsz in rows.items()}


def _read_scalability(path: Path) -> dict[tuple[int, int, int], Times]:
    has = f"a scalability file has {list(SCALABILITY_COLUMNS)}"
    points: dict[tuple[int, int, int], Times] = {}
    for line, row in csv_rows(path, SCALABILITY_COLUMNS, "scalability file", has):
        nodes = whole_number(path, line, row, "num_nodes")
        replicas = whole_number(path, line, row, "num_replicas")
        if replicas < nodes:
            raise row_error(path, line, "num_replicas", f"at least num_nodes ({nodes})", str(replicas))
        key = (nodes, replicas, whole_number(path, line, row, "local_bsz"))
        if key in points:
            raise row_error(
                path, line, "local_bsz", "one row per num_nodes, num_replicas and batch", str(key)
            )
        points[key] = _times(path, line, row)
    return points


def _read_curves(folder: Path) -> tuple[Curve, ...]:
    paths = sorted(folder.glob("validation-*.csv"))
    curves = []
    for path in paths:
        match = VALIDATION_NAME.fullmatch(path.name)
        if match is None or int(match[1]) < 1:
            raise TraceError(f"{path}: expected a name validation-<global batch>.csv")
        progress: list[float] = []
        grad_sqr: list[float] = []
        grad_var: list[float] = []
        has = f"a validation file has {list(VALIDATION_COLUMNS)}"
        for line, row in csv_rows(path, VALIDATION_COLUMNS, "validation file", has):
            value = _number(path, line, row, "progress")
            if value <= (progress[-1] if progress else 0.0):
                raise row_error(path, line, "progress", "more than the row before (and > 0)", str(value))
            progress.append(value)
            grad_sqr.append(_number(path, line, row, "grad_sqr"))
            grad_var.append(_number(path, line, row, "grad_var"))
            if grad_sqr[-1] + grad_var[-1] == 0:
                raise row_error(path, line, "grad_var", "grad_sqr or grad_var above 0", "0")
        if not progress:
            raise TraceError(f"{path}: no rows")
        curves.append(Curve(int(match[1]), tuple(progress), tuple(grad_sqr), tuple(grad_var)))
    if not curves:
        raise TraceError(f"{folder}: no validation-<global batch>.csv")
    return tuple(sorted(curves, key=lambda c: c.batch_size))


def _times(path: Path, line: int, row: dict[str, str]) -> Times:
    step = _number(path, line, row, "step_time")
    sync = _number(path, line, row, "sync_time")
    if step <= 0 or sync > step:
        raise row_error(path, line, "step_time", f"seconds > 0 and >= sync_time ({sync})", str(step))
    return step, sync


def _number(path: Path, line: int, row: dict[str, str], column: str) -> float:
    """A finite number >= 0."""
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise row_error(path, line, column, "a finite number >= 0", raw)
    return value


def whole_number(path: Path, line: int, row: dict[str, str], column: str) -> int:
    """A whole number >= 1."""
    raw = (row.get(column) or "").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise row_error(path, line, column, "a whole number >= 1", raw)
    return int(raw)


def row_error(path: Path, line: int, column: str, expected: str, got: str) -> TraceError:
    """An input file's bad value, named by file, line and column (as `gpuyard.sim.trace` does)."""
    return TraceError(f"{path}: row {line}, column {column!r}: expected {expected}, got {got!r}")


def _lerp(a: Times, b: Times, w: float) -> Times:
    return a[0] + (b[0] - a[0]) * w, a[1] + (b[1] - a[1]) * w
