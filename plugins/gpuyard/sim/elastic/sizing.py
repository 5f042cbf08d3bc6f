"""gpuyard's elastic sizing policy in the Pollux replay: how many GPUs each job holds, where, at what batch.

Each interval, for every active job:
- a step-time model fitted from the job's own heartbeats (step and sync seconds at the placements and
  local batches it ran, `StepModel`), a prior for what it has not run yet;
- its goodput at each candidate size: progress per second, i.e. throughput times the statistical
  efficiency its measured gradient noise predicts at the batch (adaptive batch), or at its tuned
  batch (fixed batch, where efficiency is a constant of the job and only throughput matters);
- GPUs are handed out one jump at a time to the job whose speedup gains most per GPU (`_sizes`);
  the utility is Pollux's harmonic mean of speedups (each job's speedup over itself on 1 GPU), which
  favours the jobs furthest behind, and any size other than the held one is charged its restart.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuyard.sim.elastic.jobs import ElasticJob
from gpuyard.sim.elastic.profiles import Application

Allocation = tuple[int, ...]  # the node of each GPU a job holds (as policies.Allocation)

# The prior's sync overhead, as a share of the job's 1-GPU compute at its tuned local batch, until the
# job has run in that regime: a quarter within a node (an intra-node all-reduce is cheap but not free),
# a whole step across nodes (a job spreads over nodes only if it gains even at half efficiency). Round,
# conservative numbers; a job's first run in a regime replaces them with its own measurement.
PRIOR_SYNC_SHARE_INTRA = 0.25
PRIOR_SYNC_SHARE_INTER = 1.0
GROWTH_FACTOR = 2  # beyond its tuned size a job at most doubles what it has run (as Pollux explores)
BATCH_CANDIDATES = 10  # global batches tried per size, geometric between the bounds
# Restarts may cost at most a tenth of the time: a size is expected to hold (and a turn on a GPU, when
# jobs outnumber GPUs, lasts) at least this many restarts, or the job's age if it is younger.
TURN_RESTARTS = 10


@dataclass
class StepModel:
    """One job's step time, fitted from its own heartbeats, with a prior from its family's 1-GPU row.

    Time of one optimizer step = compute(atomic batch) x (accum_steps + 1) + sync(nodes, GPUs). Compute
    is linear in the local batch; sync is a constant plus a ring term growing with the GPUs, fitted
    apart within one node and across nodes (different links). Inputs of the prior, and nothing else of
    the profile: the family's 1-GPU compute per local batch and 1-GPU sync (its single-GPU benchmark).
    """

    prior_compute: tuple[float, float]  # (seconds at batch 0, seconds per example) on 1 GPU
    prior_single_sync: float
    reference_compute: float  # 1-GPU compute at the tuned local batch: the prior syncs' scale
    runs: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    # The fit of `runs` (refitted on each new run): compute line, 1-GPU sync, sync lines within a node
    # and across nodes (None: never ran so).
    compute: tuple[float, float] = (0.0, 0.0)
    single_sync: float = 0.0
    intra: tuple[float, float] | None = None
    inter: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self._fit()

    @classmethod
    def prior(cls, app: Application, tuned_local_bsz: int) -> StepModel:
        single = app.placements[(1,)]
        points = [
            (float(b), step - sync) for b, (step, sync) in zip(single.local_bsz, single.times, strict=True)
        ]
        line = _line(points)
        sync = sum(s for _, s in single.times) / len(single.times)
        return cls(line, sync, line[0] + line[1] * tuned_local_bsz)

    def observe(self, nodes: int, gpus: int, atomic_bsz: int, step_s: float, accum_s: float) -> None:
        """A heartbeat: one step (the last micro-batch and the sync) and one accumulated micro-batch."""
        if self.runs.get((nodes, gpus, atomic_bsz)) != (step_s, accum_s):
            self.runs[nodes, gpus, atomic_bsz] = (step_s, accum_s)
            self._fit()

    @property
    def most_gpus_run(self) -> int:
        return max((gpus for _, gpus, _ in self.runs), default=0)

    def compute_s(self, atomic_bsz: float) -> float:
        return self.compute[0] + self.compute[1] * atomic_bsz

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

    def step_s(self, nodes: int, gpus: int, atomic_bsz: int, accum_steps: int) -> float:
        return self.compute_s(atomic_bsz) * (accum_steps + 1) + self.sync_s(nodes, gpus)

    def _fit(self) -> None:
        """Compute: its own line once it ran two local batches; before, the prior's line scaled to
        the batch it ran (or the prior itself). Sync: a + b * (gpus - 2) per kind of link, the ring's
        growth b only once two GPU counts of that kind ran (until then none is assumed)."""
        points = [(float(b), accum) for (_, _, b), (_, accum) in self.runs.items()]
        if len({b for b, _ in points}) >= 2:
            self.compute = _line(points)
        else:
            a, k = self.prior_compute
            scale = sum(accum / (a + k * b) for b, accum in points) / len(points) if points else 1.0
            self.compute = (scale * a, scale * k)
        single = [step - accum for (_, g, _), (step, accum) in self.runs.items() if g == 1]
        self.single_sync = sum(single) / len(single) if single else self.prior_single_sync
        self.intra, self.inter = (self._sync_line(across) for across in (False, True))

    def _sync_line(self, across: bool) -> tuple[float, float] | None:
        points = [
            (float(g - 2), step - accum)
            for (n, g, _), (step, accum) in self.runs.items()
            if g > 1 and (n > 1) == across
        ]
        if not points:
            return None
        if len({x for x, _ in points}) >= 2:
            return _line(points)
        return sum(y for _, y in points) / len(points), 0.0


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
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


@dataclass(frozen=True)
class Option:
    """A size for a job: its best global batch there and the goodput it predicts."""

    gpus: int
    batch: int
    goodput: float  # progress (steps at the initial batch) per second


class GpuyardSizing:
    """Sizes every active job each interval (see the module's docstring); `adaptive_batch` off keeps
    each job at its tuned global batch, so that only the number of GPUs changes.

    Rules, each with its reason:
    - every active job holds at least 1 GPU while there are as many GPUs as jobs; with fewer, the jobs
      with the least GPU-seconds attained run, a running job keeping its GPU until it has attained
      `TURN_RESTARTS` restarts' worth more than a waiting one (so restarts cost at most a tenth of a
      turn), and no job starves: a waiting job's attained service stands still while others' grows;
    - shrink before preempt: after the 1 GPU each, GPUs go by marginal gain, so a large job gives back
      its least useful GPUs before any job is left without one;
    - a size other than the one held is worth its speedup times (1 - restart / horizon), the horizon
      being the job's age (what it ran so far is the best guess of what is left): no resize is made
      for less than its restart over that horizon; a job starting anyway pays its restart at any size;
    - an idle GPU is worth nothing: it goes to any job whose speedup it raises by more than the
      restart costs, and none is held back;
    - jobs of more GPUs than a node take whole nodes (sizes 1-4, then multiples of 4): their sync is
      then across as few nodes as possible and small jobs fill the nodes left partly used.
    """

    def __init__(
        self, adaptive_batch: bool = True, restart_s: float = 30.0, interval_s: float = 60.0
    ) -> None:
        self.adaptive_batch = adaptive_batch
        self.restart_s = restart_s
        self.interval_s = interval_s
        self.models: dict[str, StepModel] = {}
        self.tuned: dict[str, tuple[int, int]] = {}  # (GPUs, batch) the user tuned
        self.attained_gpu_s: dict[str, float] = {}
        self.noise: dict[str, float] = {}  # the gradient noise each job measured last
        self.checked_s = 0

    def allocate(
        self, now_s: int, jobs: Sequence[ElasticJob], node_gpus: Sequence[int], held: Mapping[str, Allocation]
    ) -> dict[str, Allocation]:
        self._heartbeats(now_s, jobs, held)
        node_size = max(node_gpus)
        runnable = self._runnable(jobs, sum(node_gpus), held)
        options = {job.name: self._options(job, now_s, node_size, sum(node_gpus)) for job in runnable}
        sizes = _sizes(
            [
                (job.name, options[job.name], len(held.get(job.name, ())), self._keep_factor(job, now_s))
                for job in runnable
            ],
            sum(node_gpus),
        )
        keep = {name: held[name] for name, gpus in sizes.items() if len(held.get(name, ())) == gpus}
        allocations = _place({n: g for n, g in sizes.items() if n not in keep}, keep, node_gpus)
        for job in runnable:
            chosen = next(o for o in options[job.name] if o.gpus == sizes[job.name])
            self._set_batch(job, chosen, job.name in keep)
        return allocations

    def _heartbeats(self, now_s: int, jobs: Sequence[ElasticJob], held: Mapping[str, Allocation]) -> None:
        """What the workers report: step and micro-batch seconds where each job ran, and GPU-time."""
        for job in jobs:
            if job.name not in self.models:
                self.tuned[job.name] = (job.num_replicas, job.batch_size)
                local = math.ceil(job.batch_size / job.num_replicas)
                self.models[job.name] = StepModel.prior(job.app, min(local, job.app.max_local_bsz))
                self.attained_gpu_s[job.name] = 0.0
            if job.placement and job.name in held:
                nodes, gpus = len(job.placement), sum(job.placement)
                self.models[job.name].observe(nodes, gpus, job.atomic_bsz, job.step_s, job.accum_s)
                self.attained_gpu_s[job.name] += gpus * (now_s - self.checked_s)
                if self.adaptive_batch and not job.app.pinned:
                    sqr, var = job.app.grad_stats(job.trained_batch, job.epoch)
                    self.noise[job.name] = var / sqr if sqr > 0 else math.inf
        self.checked_s = now_s

    def _runnable(
        self, jobs: Sequence[ElasticJob], gpus: int, held: Mapping[str, Allocation]
    ) -> list[ElasticJob]:
        """All jobs if each can have a GPU; else the least served, a running job ahead by a turn."""
        if len(jobs) <= gpus:
            return list(jobs)
        turn = TURN_RESTARTS * self.restart_s

        def served(job: ElasticJob) -> tuple[float, float]:
            return self.attained_gpu_s[job.name] - (turn if held.get(job.name) else 0.0), job.submitted_s

        chosen = {job.name for job in sorted(jobs, key=served)[:gpus]}
        return [job for job in jobs if job.name in chosen]

    def _keep_factor(self, job: ElasticJob, now_s: int) -> float:
        """The share of the horizon a restart leaves: what a resize's speedup is worth. The horizon is
        how long a size is expected to hold: `TURN_RESTARTS` restarts, less for a job younger than
        that (what it ran so far is the best guess of what is left), at least an interval."""
        horizon = max(min(now_s - job.submitted_s, TURN_RESTARTS * self.restart_s), self.interval_s)
        return max(1.0 - self.restart_s / horizon, 0.0)

    def _options(self, job: ElasticJob, now_s: int, node_size: int, cluster: int) -> list[Option]:
        """The job's candidate sizes, each at its best batch, up to what it may grow to."""
        app, model = job.app, self.models[job.name]
        if app.pinned:
            return [Option(1, app.pinned[1], 1.0)]
        tuned_gpus, tuned_batch = self.tuned[job.name]
        min_local = app.placements[(1,)].local_bsz[0]
        top_batch = app.max_batch_size if self.adaptive_batch else tuned_batch
        limit = min(cluster, top_batch // min_local, max(tuned_gpus, GROWTH_FACTOR * model.most_gpus_run))
        noise = self.noise.get(job.name)
        sizes = [g for g in (1, 2, 3) if g < node_size] + list(range(node_size, limit + 1, node_size))
        options = []
        for gpus in (g for g in sizes if g <= limit):
            nodes = math.ceil(gpus / node_size)
            best = self._best_batch(job, model, nodes, gpus, min_local, tuned_batch, noise)
            if best is not None:
                options.append(best)
        return options

    def _best_batch(
        self,
        job: ElasticJob,
        model: StepModel,
        nodes: int,
        gpus: int,
        min_local: int,
        tuned_batch: int,
        noise: float | None,
    ) -> Option | None:
        app = job.app
        if self.adaptive_batch:
            low = max(app.init_batch_size, gpus * min_local)
            # Before the job measured its gradient noise a larger batch is assumed worth no more than
            # one small step (efficiency 1/scale): it starts at the smallest batch its GPUs take.
            batches = _geometric(low, app.max_batch_size) if noise is not None else [low]
        else:
            batches = [tuned_batch]
        best: Option | None = None
        for batch in batches:
            if batch > app.max_batch_size:
                continue
            atomic, accum = app.batch_split(gpus, batch)
            if atomic < min_local:
                continue
            trained = gpus * atomic * (accum + 1)
            goodput = _gain(trained / app.init_batch_size, noise) / model.step_s(nodes, gpus, atomic, accum)
            if best is None or goodput > best.goodput:
                best = Option(gpus, batch, goodput)
        return best

    def _set_batch(self, job: ElasticJob, option: Option, kept: bool) -> None:
        """The job's own agent: the batch of its new size; a job kept on its GPUs re-splits its batch
        without a restart, as adaptdl does between steps (the replay restarts only resized jobs)."""
        if option.batch == job.batch_size:
            return
        job.batch_size = option.batch
        if kept and job.placement:
            restart_left_s, allocations = job.restart_left_s, job.allocations
            job.reallocate(job.placement, restart_left_s)
            job.allocations = allocations


def _gain(scale: float, noise: float | None) -> float:
    """Progress of one step at `scale` times the initial batch: (noise + 1) / (noise / scale + 1)."""
    if noise is None:
        return 1.0
    if math.isinf(noise):
        return scale
    return (noise + 1) / (noise / scale + 1)


def _geometric(low: int, high: int) -> list[int]:
    if low >= high:
        return [low]
    ratio = (high / low) ** (1 / (BATCH_CANDIDATES - 1))
    return sorted({round(low * ratio**i) for i in range(BATCH_CANDIDATES)} | {high})


def _sizes(jobs: Sequence[tuple[str, list[Option], int, float]], gpus: int) -> dict[str, int]:
    """GPUs per job: 1 each (its smallest option), then jumps by best gain per GPU while any gains.

    A job's value at a size is -1 / speedup (the harmonic mean's term), its speedup over its 1-GPU
    goodput times its keep factor for a size other than the held one (`held` of 0: starting anyway).
    Jumps may skip sizes, so that a held size beyond a dip (the restart) is still reached.
    """
    values: dict[str, dict[int, float]] = {}
    size: dict[str, int] = {}
    for name, options, held, keep in jobs:
        base = options[0].goodput
        values[name] = {
            o.gpus: -base / (o.goodput * (1.0 if o.gpus == held or not held else keep) or 1e-12)
            for o in options
        }
        size[name] = options[0].gpus
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


def _place(
    sizes: Mapping[str, int], keep: Mapping[str, Allocation], node_gpus: Sequence[int]
) -> dict[str, Allocation]:
    """Kept jobs stay where they are; the others, largest first, take whole free nodes, then the node
    that fits them most tightly (partly used nodes fill up before whole ones are broken)."""
    free = list(node_gpus)
    for allocation in keep.values():
        for node in allocation:
            free[node] -= 1
    allocations = dict(keep)
    capacity = max(node_gpus)
    for name, gpus in sorted(sizes.items(), key=lambda item: -item[1]):
        taken: list[int] = []
        for node in range(len(free)):
            if gpus - len(taken) >= capacity and free[node] == capacity:
                taken.extend([node] * capacity)
                free[node] = 0
        while len(taken) < gpus:
            left = gpus - len(taken)
            fits = [n for n in range(len(free)) if free[n] >= left]
            node = min(fits, key=lambda n: free[n]) if fits else max(range(len(free)), key=free.__getitem__)
            take = min(free[node], left)
            taken.extend([node] * take)
            free[node] -= take
        allocations[name] = tuple(taken)
    return allocations
