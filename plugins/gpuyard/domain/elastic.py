"""Elastic jobs' sizing, pure: a job's step-time model fitted from what it measured, and the rule that
hands GPUs to the jobs they speed up most, each resize charged its restart.

The scheduler service (`scheduler/sizing.py`) and the Pollux replay (`sim/elastic/sizing.py`) both
size with this code; they differ only in what they feed it (a heartbeat's whole step, or a step and
one micro-batch apart) and in which GPUs they hand out (the idle ones, or all).

- `StepModel`: seconds of one optimizer step at a size, fitted from the job's runs (the nodes, GPUs,
  micro-batch and micro-batches of each, and the step's seconds), a prior for what it has not run;
- `keep_factor`: what a resize's speedup is worth once its restart is paid;
- `sizes`: GPUs per job by marginal gain of the harmonic mean of the jobs' speedups (Pollux's fairness
  with p = -1), each speedup over the job's goodput at a fair share of the GPUs, from a start size
  each, a size other than the held one charged its restart.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The prior's sync overhead, as a share of the job's 1-GPU compute at its reference (tuned) local
# batch, until the job has run in that regime: a quarter within a node (an intra-node all-reduce is
# cheap but not free), a whole step across nodes (a job spreads over nodes only if it gains even at
# half efficiency). Round, conservative numbers; a job's first run in a regime replaces them.
PRIOR_SYNC_SHARE_INTRA = 0.25
PRIOR_SYNC_SHARE_INTER = 1.0
# A job at most quadruples the most GPUs it has run: its fitted lines are stretched no further past
# what it measured. Pollux doubles; with this model's conservative prior for a regime a job never ran,
# doubling only made each climb pay a restart and an interval more per step (the Pollux replay's mean
# over its 28 replays: 0.739 h doubling, 0.728 h quadrupling, 0.726 h unbounded).
GROWTH_FACTOR = 4
# Restarts may cost at most a tenth of the time: a size is expected to hold at least this many
# restarts, or the job's age if it is younger (what it ran so far is the best guess of what is left).
TURN_RESTARTS = 10

Run = tuple[int, int, int]  # (nodes, GPUs, micro-batch per GPU)


@dataclass(frozen=True)
class Measured:
    """One run's measure: seconds of a whole optimizer step (its `micro_batches` micro-batches, the
    sync, the update), and of one micro-batch alone where the worker measured it apart."""

    step_s: float
    micro_batches: int
    micro_batch_s: float | None = None


@dataclass
class StepModel:
    """One job's step time, fitted from its own runs, with a prior from its family.

    Time of one optimizer step = compute(micro-batch) x micro-batches + sync(nodes, GPUs). Compute is
    linear in the micro-batch; sync is a constant plus a ring term growing with the GPUs, fitted apart
    within one node and across nodes (different links). The prior: a compute line (seconds at batch
    0, seconds per example) on 1 GPU, the 1-GPU sync, and the reference micro-batch whose compute sets
    the scale of the prior syncs (`PRIOR_SYNC_SHARE_*`). A prior in arbitrary units (the service's:
    compute proportional to the examples) takes its seconds from the job's whole steps.
    """

    prior_compute: tuple[float, float]
    prior_single_sync: float
    reference_batch: float
    runs: dict[Run, Measured] = field(default_factory=dict)
    # The fit of `runs` (refitted on each new measure): compute line, 1-GPU sync, sync lines within a
    # node and across nodes (None: never ran so).
    compute: tuple[float, float] = (0.0, 0.0)
    single_sync: float = 0.0
    intra: tuple[float, float] | None = None
    inter: tuple[float, float] | None = None
    # Seconds per unit of the prior: 1 for a prior in seconds (the family measured its 1-GPU row);
    # for a prior without unit, fitted to the job's whole steps while it measured nothing apart.
    prior_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.reference_batch <= 0 or min(self.prior_compute) < 0 or sum(self.prior_compute) <= 0:
            raise ValueError(
                f"a step model's prior needs a compute line (a, k) >= 0 not both 0 and a reference batch "
                f"> 0, got {self.prior_compute} and {self.reference_batch}"
            )
        self._fit()

    def observe(self, nodes: int, gpus: int, micro_batch: int, measured: Measured) -> None:
        """A heartbeat's measure of a run; the newest measure of a run replaces the one before."""
        if self.runs.get((nodes, gpus, micro_batch)) != measured:
            self.runs[nodes, gpus, micro_batch] = measured
            self._fit()

    @property
    def most_gpus_run(self) -> int:
        return max((gpus for _, gpus, _ in self.runs), default=0)

    def compute_s(self, micro_batch: float) -> float:
        return self.compute[0] + self.compute[1] * micro_batch

    @property
    def reference_compute(self) -> float:
        """The prior's 1-GPU compute at the reference micro-batch (in seconds: `prior_scale` gives a
        prior without unit the one of the job's steps): the prior syncs' scale."""
        a, k = self.prior_compute
        return self.prior_scale * (a + k * self.reference_batch)

    def sync_s(self, nodes: int, gpus: int) -> float:
        if gpus == 1:
            return self.single_sync
        intra = None if self.intra is None else self.intra[0] + self.intra[1] * (gpus - 2)
        if nodes == 1:
            return intra if intra is not None else PRIOR_SYNC_SHARE_INTRA * self.reference_compute
        if self.inter is not None:
            return self.inter[0] + self.inter[1] * (gpus - 2)
        # Across nodes is never assumed faster than what the job measured within one.
        return max(PRIOR_SYNC_SHARE_INTER * self.reference_compute, intra or 0.0)

    def step_s(self, nodes: int, gpus: int, micro_batch: float, micro_batches: int) -> float:
        return self.compute_s(micro_batch) * micro_batches + self.sync_s(nodes, gpus)

    def _fit(self) -> None:
        """Compute: its own line once it measured micro-batches at two sizes; before, the prior's line
        scaled to the micro-batches it measured, or (measuring whole steps only) scaled so that the
        prior explains those steps (its 1-GPU ones where it has some). Sync: what a step took beyond
        its compute, a + b * (gpus - 2) per kind of link, the ring's growth b only once two GPU counts
        of that kind ran."""
        apart = [
            (float(b), m.micro_batch_s) for (_, _, b), m in self.runs.items() if m.micro_batch_s is not None
        ]
        a, k = self.prior_compute
        self.prior_scale = 1.0
        if len({b for b, _ in apart}) >= 2:
            self.compute = fit_line(apart)
        elif apart:
            scale = sum(s / (a + k * b) for b, s in apart) / len(apart)
            self.compute = (scale * a, scale * k)
        else:
            # Its 1-GPU steps hold no sync to guess: they alone set the scale where it ran so.
            whole = [(run, m) for run, m in self.runs.items() if run[1] == 1] or list(self.runs.items())
            if whole:
                self.prior_scale = sum(m.step_s / self._prior_step(run, m.micro_batches) for run, m in whole)
                self.prior_scale /= len(whole)
            self.compute = (self.prior_scale * a, self.prior_scale * k)
        single = [
            self._sync(run, m) for run, m in self.runs.items() if run[1] == 1 and m.micro_batch_s is not None
        ]
        self.single_sync = sum(single) / len(single) if single else self.prior_single_sync
        self.intra, self.inter = (self._sync_line(across) for across in (False, True))

    def _prior_step(self, run: Run, micro_batches: int) -> float:
        nodes, gpus, b = run
        a, k = self.prior_compute
        compute = a + k * b
        reference = a + k * self.reference_batch
        share = PRIOR_SYNC_SHARE_INTRA if nodes == 1 else PRIOR_SYNC_SHARE_INTER
        sync = self.prior_single_sync if gpus == 1 else share * reference
        return compute * micro_batches + sync

    def _sync(self, run: Run, measured: Measured) -> float:
        micro = measured.micro_batch_s if measured.micro_batch_s is not None else self.compute_s(run[2])
        return max(measured.step_s - micro * measured.micro_batches, 0.0)

    def _sync_line(self, across: bool) -> tuple[float, float] | None:
        points = [
            (float(g - 2), self._sync((n, g, b), m))
            for (n, g, b), m in self.runs.items()
            if g > 1 and (n > 1) == across
        ]
        if not points:
            return None
        if len({x for x, _ in points}) >= 2:
            return fit_line(points)
        return sum(y for _, y in points) / len(points), 0.0


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + k x with a, k >= 0 (time never falls with more work)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    k = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    if k < 0:
        return my, 0.0
    a = my - k * mx
    if a < 0:
        sx2 = sum(x * x for x, _ in points)
        return 0.0, (sum(x * y for x, y in points) / sx2 if sx2 > 0 else 0.0)
    return a, k


def growth_limit(model: StepModel, start: int) -> int:
    """The most GPUs a job may be sized to now: `GROWTH_FACTOR` times the most it ran, at least `start`."""
    return max(start, GROWTH_FACTOR * model.most_gpus_run)


def keep_factor(age_s: float, restart_s: float, floor_s: float) -> float:
    """The share of a resize's horizon its restart leaves: what the resize's speedup is worth. The
    horizon is how long a size is expected to hold: `TURN_RESTARTS` restarts, less for a job younger
    than that (what it ran so far is the best guess of what is left), at least `floor_s`."""
    horizon = max(min(age_s, TURN_RESTARTS * restart_s), floor_s)
    return max(1.0 - restart_s / horizon, 0.0) if horizon > 0 else 0.0


@dataclass(frozen=True)
class Sizing:
    """A job as `sizes` reads it: its goodput at each size it may have (progress per second, in any
    unit of its own), the GPUs it holds (0: none, or starting anyway: no size is charged a restart),
    its `keep_factor`, and the size it is given before any GPU is handed out."""

    name: str
    goodput: Mapping[int, float]
    held: int
    keep: float
    start: int

    def __post_init__(self) -> None:
        if self.start not in self.goodput:
            raise ValueError(
                f"{self.name}: start size {self.start} is not one of its sizes {sorted(self.goodput)}"
            )


def fair_goodput(goodput: Mapping[int, float], share: int) -> float:
    """A job's goodput at a fair share of `share` GPUs: at the largest of its sizes within the share,
    at its smallest where none is."""
    within = [g for g in goodput if g <= share]
    return goodput[max(within)] if within else goodput[min(goodput)]


def sizes(jobs: Sequence[Sizing], gpus: int) -> dict[str, int]:
    """GPUs per job out of `gpus`: each its start size, then jumps by best gain per GPU while any gains.

    A job's value at a size is -1 / speedup (the harmonic mean's term: the jobs furthest behind gain
    most), times its keep factor for a size other than the held one. Its speedup is over its goodput
    at a fair share of the GPUs (`gpus` over the jobs, `fair_goodput`), as Pollux's policy
    normalizes: each job's speedup is 1 at its share, so that a job that scales well weighs what
    it makes of its GPUs up to its share, not only of its first one. Jumps may skip sizes, so that a
    held size beyond a dip (the restart) is still reached. Sizes only grow from the start: a job is
    never given less than it starts at.
    """
    values: dict[str, dict[int, float]] = {}
    size: dict[str, int] = {}
    share = max(1, -(-gpus // len(jobs))) if jobs else 1
    for job in jobs:
        base = fair_goodput(job.goodput, share)
        values[job.name] = {
            g: -base / ((goodput * (1.0 if g == job.held or not job.held else job.keep)) or 1e-12)
            for g, goodput in job.goodput.items()
        }
        size[job.name] = job.start
    free = gpus - sum(size.values())
    heap: list[tuple[float, str, int]] = []

    def push(name: str) -> None:
        here = values[name][size[name]]
        jumps = [
            ((value - here) / (g - size[name]), g)
            for g, value in values[name].items()
            if size[name] < g <= size[name] + free
        ]
        if jumps:
            gain, target = max(jumps)
            if gain > 0:
                heapq.heappush(heap, (-gain, name, target))

    for name in size:
        push(name)
    while heap and free > 0:
        _, name, target = heapq.heappop(heap)
        if target <= size[name] or target - size[name] > free:
            push(name)  # stale: its size or the GPUs left changed since it was pushed
            continue
        free -= target - size[name]
        size[name] = target
        push(name)
    return size


def worker_split(global_batch: int, workers: int, micro_batch_bound: int) -> tuple[int, int] | None:
    """(micro-batch, micro-batches) of each of `workers` for a fixed `global_batch`, the micro-batch the
    largest divisor of the worker's share within `micro_batch_bound`, as the training runtime splits
    it (training/batching.py); None where the batch does not split over that many workers."""
    if workers < 1 or global_batch % workers:
        return None
    share = global_batch // workers
    bound = max(1, min(micro_batch_bound, share))
    micro = next(b for b in range(bound, 0, -1) if share % b == 0)
    return micro, share // micro
