"""gpuyard's elastic sizing policy in the Pollux replay: how many GPUs each job holds, where, at what batch.

The model and the rule are the platform scheduler's (`gpuyard.domain.elastic`); this module feeds
them the replay's jobs. Each interval, for every active job:
- a step-time model fitted from the job's own heartbeats (a whole step and one micro-batch at the
  placements and local batches it ran, `StepModel`), its family's 1-GPU row for what it has not run;
- its goodput at each candidate size: progress per second, i.e. throughput times the statistical
  efficiency its measured gradient noise predicts at the batch (adaptive batch), or at its tuned
  batch (fixed batch, where efficiency is a constant of the job and only throughput matters);
- GPUs are handed out one jump at a time to the job whose speedup gains most per GPU (`sizes`);
  the utility is Pollux's harmonic mean of speedups (each job's speedup over itself at a fair share
  of the GPUs), which favours the jobs furthest behind, and any size other than the held one is
  charged its restart;
- each job's agent re-picks its batch at every epoch's end on the GPUs it holds, by its model and the
  noise it measured in the epoch it ended (adaptdl's jobs do so between the scheduler's decisions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpuyard.domain.elastic import (
    TURN_RESTARTS,
    Measured,
    Sizing,
    StepModel,
    fit_line,
    growth_limit,
    keep_factor,
    sizes,
)
from gpuyard.sim.elastic.jobs import ElasticJob, best_batch
from gpuyard.sim.elastic.profiles import Application

from training.efficiency import GradStats

Allocation = tuple[int, ...]  # the node of each GPU a job holds (as policies.Allocation)


def prior_model(app: Application, tuned_local_bsz: int) -> StepModel:
    """The family prior: the application's 1-GPU row (its single-GPU benchmark), compute linear in
    the local batch, and its mean sync; the prior syncs scaled to the tuned local batch."""
    single = app.placements[(1,)]
    points = [(float(b), step - sync) for b, (step, sync) in zip(single.local_bsz, single.times, strict=True)]
    sync = sum(s for _, s in single.times) / len(single.times)
    return StepModel(fit_line(points), sync, tuned_local_bsz)


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
      being ten restarts, or the job's age if it is younger (what it ran so far is the best guess of
      what is left): no resize is made for less than its restart over that horizon; a job starting
      anyway pays its restart at any size;
    - an idle GPU is worth nothing: it goes to any job whose speedup it raises by more than the
      restart costs, and none is held back;
    - jobs of more GPUs than a node take whole nodes (sizes 1-4, then multiples of 4): their sync is
      then across as few nodes as possible and small jobs fill the nodes left partly used;
    - a job that fits a node gets one: where none has room, smaller jobs move out of the node where
      that moves the fewest GPUs (each pays a restart), since a gang spread over nodes syncs across
      them at every step (yolov3's 4 GPUs take 2.5 times as long a step on 3 + 1 as on one node).
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
        self.noise: dict[str, GradStats] = {}  # the gradient's statistics each job measured last
        self.checked_s = 0

    def allocate(
        self, now_s: int, jobs: Sequence[ElasticJob], node_gpus: Sequence[int], held: Mapping[str, Allocation]
    ) -> dict[str, Allocation]:
        self._heartbeats(now_s, jobs, held)
        node_size = max(node_gpus)
        runnable = self._runnable(jobs, sum(node_gpus), held)
        options = {job.name: self._options(job, now_s, node_size, sum(node_gpus)) for job in runnable}
        chosen_sizes = sizes(
            [
                Sizing(
                    job.name,
                    {o.gpus: o.goodput for o in options[job.name]},
                    len(held.get(job.name, ())),
                    keep_factor(now_s - job.submitted_s, self.restart_s, self.interval_s),
                    options[job.name][0].gpus,
                )
                for job in runnable
            ],
            sum(node_gpus),
        )
        keep = {name: held[name] for name, gpus in chosen_sizes.items() if len(held.get(name, ())) == gpus}
        allocations = place({n: g for n, g in chosen_sizes.items() if n not in keep}, keep, node_gpus)
        for job in runnable:
            if self.adaptive_batch and not job.app.pinned:
                job.agent = self._agent
            chosen = next(o for o in options[job.name] if o.gpus == chosen_sizes[job.name])
            if chosen.batch != job.batch_size:
                job.rebatch(chosen.batch, kept=job.name in keep)
        return allocations

    def _heartbeats(self, now_s: int, jobs: Sequence[ElasticJob], held: Mapping[str, Allocation]) -> None:
        """What the workers report: step and micro-batch seconds where each job ran, and GPU-time."""
        for job in jobs:
            if job.name not in self.models:
                self.tuned[job.name] = (job.num_replicas, job.batch_size)
                local = math.ceil(job.batch_size / job.num_replicas)
                self.models[job.name] = prior_model(job.app, min(local, job.app.max_local_bsz))
                self.attained_gpu_s[job.name] = 0.0
            if job.placement and job.name in held:
                nodes, gpus = len(job.placement), sum(job.placement)
                whole = job.step_s + job.accum_s * job.accum_steps
                measured = Measured(whole, job.accum_steps + 1, job.accum_s)
                self.models[job.name].observe(nodes, gpus, job.atomic_bsz, measured)
                self.attained_gpu_s[job.name] += gpus * (now_s - self.checked_s)
                if self.adaptive_batch and not job.app.pinned:
                    self.noise[job.name] = GradStats(*job.app.grad_stats(job.trained_batch, job.epoch))
        self.checked_s = now_s

    def _agent(self, job: ElasticJob) -> int:
        """The job's batch from an epoch's end on the GPUs it holds: the best by its step-time model
        and the noise it measured in the epoch it ended."""
        noise = GradStats(*job.app.grad_stats(job.trained_batch, job.epoch - 1))
        self.noise[job.name] = noise
        model, nodes, gpus = self.models[job.name], len(job.placement), sum(job.placement)
        best = best_batch(job.app, gpus, lambda atomic, n: model.step_s(nodes, gpus, atomic, n), noise)
        return job.batch_size if best is None else best[0]

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

    def _options(self, job: ElasticJob, now_s: int, node_size: int, cluster: int) -> list[Option]:
        """The job's candidate sizes, each at its best batch, up to what it may grow to."""
        app, model = job.app, self.models[job.name]
        if app.pinned:
            return [Option(1, app.pinned[1], 1.0)]
        tuned_gpus, tuned_batch = self.tuned[job.name]
        min_local = app.placements[(1,)].local_bsz[0]
        top_batch = app.max_batch_size if self.adaptive_batch else tuned_batch
        limit = min(cluster, top_batch // min_local, growth_limit(model, tuned_gpus))
        noise = self.noise.get(job.name)
        sizes = [g for g in (1, 2, 3) if g < node_size] + list(range(node_size, limit + 1, node_size))
        options = []
        for gpus in (g for g in sizes if g <= limit):
            nodes = math.ceil(gpus / node_size)
            best = self._best_batch(job, model, nodes, gpus, tuned_batch, noise)
            if best is not None:
                options.append(best)
        return options

    def _best_batch(
        self,
        job: ElasticJob,
        model: StepModel,
        nodes: int,
        gpus: int,
        tuned_batch: int,
        noise: GradStats | None,
    ) -> Option | None:
        def step_s(atomic: int, micro_batches: int) -> float:
            return model.step_s(nodes, gpus, atomic, micro_batches)

        fixed = None if self.adaptive_batch else tuned_batch
        best = best_batch(job.app, gpus, step_s, noise, fixed)
        return None if best is None else Option(gpus, *best)


def place(
    sizes: Mapping[str, int], keep: Mapping[str, Allocation], node_gpus: Sequence[int]
) -> dict[str, Allocation]:
    """Kept jobs stay where they are; the others, largest first, take whole free nodes, then the node
    that fits them most tightly (partly used nodes fill up before whole ones are broken). A job's
    part that fits a node but finds none with room moves kept jobs smaller than it out of the node
    where that moves the fewest GPUs (`_room`), and they are placed again after it."""
    free = list(node_gpus)
    for allocation in keep.values():
        for node in allocation:
            free[node] -= 1
    allocations = dict(keep)
    capacity = max(node_gpus)
    queue = sorted(sizes.items(), key=lambda item: -item[1])
    while queue:
        name, gpus = queue.pop(0)
        taken: list[int] = []
        for node in range(len(free)):
            if gpus - len(taken) >= capacity and free[node] == capacity:
                taken.extend([node] * capacity)
                free[node] = 0
        part = gpus - len(taken)
        if part and max(free) < part:
            kept = {n: a for n, a in allocations.items() if n in keep}
            moved = _room(part, free, kept, node_gpus)
            for other in moved:
                for node in allocations.pop(other):
                    free[node] += 1
            queue += [(other, len(keep[other])) for other in moved]
            queue.sort(key=lambda item: -item[1])
        while len(taken) < gpus:
            left = gpus - len(taken)
            fits = [n for n in range(len(free)) if free[n] >= left]
            node = min(fits, key=lambda n: free[n]) if fits else max(range(len(free)), key=free.__getitem__)
            take = min(free[node], left)
            taken.extend([node] * take)
            free[node] -= take
        allocations[name] = tuple(taken)
    return allocations


def _room(
    gpus: int, free: Sequence[int], kept: Mapping[str, Allocation], node_gpus: Sequence[int]
) -> list[str]:
    """The kept jobs to move so that one node has `gpus` free: jobs within one node and smaller than
    `gpus`, the fewest GPUs of them over all nodes; none where no node can be cleared so."""
    best: tuple[int, tuple[str, ...]] | None = None
    for node in range(len(free)):
        if node_gpus[node] < gpus:
            continue
        here = {name: len(a) for name, a in kept.items() if set(a) == {node} and len(a) < gpus}
        for count in range(1, len(here) + 1):
            for moved in combinations(sorted(here), count):
                cost = sum(here[name] for name in moved)
                if free[node] + cost >= gpus and (best is None or cost < best[0]):
                    best = (cost, moved)
    return list(best[1]) if best else []
