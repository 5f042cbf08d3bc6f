"""Elastic jobs of the Pollux (OSDI'21) simulator study: a workload's submissions, and how a job
progresses on the GPUs it holds (the study's `simulator.py`, `Job.step` and `Job.reallocate`).

A job trains its application until its progress reaches the end of the last epoch of the validation
curves (the study sets no target metric). Each second on its GPUs is worth `gain / step seconds` of
progress, `gain` taken at its global batch during its current epoch, for every policy: tuned jobs run
at large batches, whose steps are worth less than their size. Every (re)allocation, the first start
included, costs a restart during which the job holds its GPUs and makes no progress.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuyard.sim.elastic.profiles import Application, Placement, row_error, whole_number
from gpuyard.sim.trace import csv_rows

from training.efficiency import GradStats, gain

WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
# Global batches its agent tries per size, geometric between the bounds. It re-picks at every epoch's
# end, so the grid sets how closely its batch follows the noise as it grows: the Pollux replay's mean
# over workloads 1-4 and six delayed copies was 0.728 h with 10, 0.704 h with 20 or 30, 0.703 with 50.
BATCH_CANDIDATES = 20


@dataclass(frozen=True)
class Submission:
    """One row of a workload: `num_replicas` and `batch_size` are the user-tuned fixed size."""

    name: str
    submitted_s: float
    application: str
    num_replicas: int
    batch_size: int


@dataclass(eq=False)
class ElasticJob:
    """A job of the replay: what it asks for, what it holds now, how far it has come."""

    name: str
    app: Application
    submitted_s: float
    num_replicas: int  # GPUs a fixed-size policy gives it
    batch_size: int  # global batch it trains at
    placement: Placement = ()  # GPUs per node it holds now
    atomic_bsz: int = 0
    accum_steps: int = 0
    step_s: float = 0.0  # one step on its placement: the last micro-batch and the sync
    accum_s: float = 0.0  # one micro-batch accumulated without a sync
    epoch: int = 0
    progress: float = 0.0  # in steps at the application's initial batch
    restart_left_s: float = 0.0
    allocations: int = 0  # times it was (re)started
    completed_s: float | None = None
    # Its agent: the global batch it trains at from an epoch's end on the GPUs it holds (None: it
    # keeps its batch between allocations). adaptdl's jobs re-pick theirs as their noise grows.
    agent: Callable[[ElasticJob], int] | None = None

    @classmethod
    def from_submission(cls, submission: Submission, apps: Mapping[str, Application]) -> ElasticJob:
        app = apps[submission.application]
        replicas, batch = app.pinned or (submission.num_replicas, submission.batch_size)
        return cls(submission.name, app, submission.submitted_s, replicas, batch)

    @property
    def trained_batch(self) -> int:
        """The global batch its GPUs compute: `batch_size` as the study rounds it over the GPUs."""
        return sum(self.placement) * self.atomic_bsz * (self.accum_steps + 1)

    def reallocate(self, placement: Placement, restart_s: float) -> None:
        """Hold `placement` from now (nothing: preempted, its progress kept); a restart if any."""
        self.placement = tuple(g for g in placement if g)
        self.restart_left_s = 0.0
        if not self.placement:
            return
        replicas = sum(self.placement)
        if self.app.pinned and replicas != self.app.pinned[0]:
            raise ValueError(
                f"{self.name}: {self.app.name} trains on {self.app.pinned[0]} GPU(s), not {replicas}"
            )
        self._split()
        self.restart_left_s = restart_s
        self.allocations += 1

    def rebatch(self, batch_size: int, *, kept: bool) -> None:
        """Its agent trains at global `batch_size`: on the GPUs it keeps (`kept`), from now, re-split
        between two steps without a restart, as adaptdl does; else from its next allocation."""
        self.batch_size = batch_size
        if kept and self.placement:
            self._split()

    def _split(self) -> None:
        """Its batch over the GPUs it holds, and the step that makes on its placement."""
        self.atomic_bsz, self.accum_steps = self.app.batch_split(sum(self.placement), self.batch_size)
        self.step_s, sync_s = self.app.times(self.placement, self.atomic_bsz)
        self.accum_s = self.step_s - sync_s

    def advance(self, start_s: float, seconds: float) -> None:
        """Train for `seconds` from `start_s`; `completed_s` is set when the last epoch ends.

        The time to each epoch's end is rounded to the second, as in the study's `Job.step`; an epoch
        that ends mid-interval is followed by the next one's gain, at the batch its agent picks then
        (as the study's jobs re-pick theirs between epochs), without a restart.
        """
        if not self.placement or self.completed_s is not None:
            return
        now = start_s + min(self.restart_left_s, seconds)
        left = start_s + seconds - now
        self.restart_left_s -= now - start_s
        while left > 0:
            total_s = self.step_s + self.accum_s * self.accum_steps  # one optimizer step
            rate = self.app.gain(self.trained_batch, self.epoch) / total_s
            end = self.app.epoch_end(self.epoch)
            if self.progress + rate * left < end:
                self.progress += rate * left
                return
            delta = round((end - self.progress) / rate)
            self.progress = end
            self.epoch += 1
            now += delta
            left -= delta
            if self.epoch == self.app.epochs:
                self.completed_s = now
                return
            batch = self.batch_size if self.agent is None else self.agent(self)
            if batch != self.batch_size:
                self.rebatch(batch, kept=True)


def best_batch(
    app: Application,
    gpus: int,
    step_s: Callable[[int, int], float],
    noise: GradStats | None,
    fixed: int | None = None,
) -> tuple[int, float] | None:
    """A job's agent: the global batch that makes the most progress per second on `gpus` GPUs, and
    that progress (steps at the initial batch per second), or None where no batch fits them.

    `step_s(atomic batch, micro-batches)`: the step its model predicts; `noise`: the gradient's
    statistics it measured last (None: not yet); `fixed`: the one batch it keeps (no adaptive batch).
    With adaptive batch it tries batches geometric between the smallest its GPUs take and the largest
    measured; before it measured its noise a larger batch is assumed worth no more than one small
    step (efficiency 1 / scale): it takes the smallest.
    """
    min_local = app.placements[(1,)].local_bsz[0]
    if fixed is not None:
        batches = [fixed]
    else:
        low = max(app.init_batch_size, gpus * min_local)
        batches = _geometric(low, app.max_batch_size) if noise is not None else [low]
    best: tuple[int, float] | None = None
    for batch in batches:
        if batch > app.max_batch_size:
            continue
        atomic, accum = app.batch_split(gpus, batch)
        if atomic < min_local:
            continue
        trained = gpus * atomic * (accum + 1)
        progress = 1.0 if noise is None else gain(trained / app.init_batch_size, noise.sqr, noise.var)
        goodput = progress / step_s(atomic, accum + 1)
        if best is None or goodput > best[1]:
            best = (batch, goodput)
    return best


def _geometric(low: int, high: int) -> list[int]:
    if low >= high:
        return [low]
    ratio = (high / low) ** (1 / (BATCH_CANDIDATES - 1))
    return sorted({round(low * ratio**i) for i in range(BATCH_CANDIDATES)} | {high})


def read_workload(path: Path, apps: Mapping[str, Application]) -> list[Submission]:
    """The rows of a workload file in its order; every row checked against `apps`."""
    has = f"a workload has {list(WORKLOAD_COLUMNS)}"
    submissions: list[Submission] = []
    names: set[str] = set()
    for line, row in csv_rows(path, WORKLOAD_COLUMNS, "workload", has):
        raw = {c: (row.get(c) or "").strip() for c in WORKLOAD_COLUMNS}
        if not raw["name"] or raw["name"] in names:
            raise row_error(path, line, "name", "a name no other row has", raw["name"])
        names.add(raw["name"])
        try:
            time = float(raw["time"])
        except ValueError:
            time = -1.0
        if not 0 <= time < float("inf"):
            raise row_error(path, line, "time", "seconds >= 0 from the workload's start", raw["time"])
        app = apps.get(raw["application"])
        if app is None:
            raise row_error(path, line, "application", f"one of {sorted(apps)}", raw["application"])
        replicas, batch = (whole_number(path, line, row, c) for c in ("num_replicas", "batch_size"))
        if not app.init_batch_size <= batch <= app.max_batch_size:
            expected = f"a batch the curves measure ({app.init_batch_size}..{app.max_batch_size})"
            raise row_error(path, line, "batch_size", expected, raw["batch_size"])
        submissions.append(Submission(raw["name"], time, raw["application"], replicas, batch))
    return submissions
