"""Adaptive batch size, an opt-in (`train.adaptive_batch: {min, max}`): the global batch a run trains at
moves within the bounds to where it makes the most progress per second, as Pollux (OSDI'21) chooses it.

Each step measures the gradient's noise from the piece gradients it computes anyway (each worker's
micro-batches: `training.efficiency.estimate`), averaged over the steps. Every `every_steps` steps the
run takes, among the candidate batches (`candidates`), the one of the most goodput: throughput x
statistical efficiency, that is `gain(M / M0) / step_s(M)` with M0 = `train.global_batch_size` (the
batch a run starts at and its learning rate is tuned for) and `step_s` from the step's measured cost
at the batch's split over the current workers (`StepCost`). The learning rate follows the batch by
the square-root rule, lr x sqrt(M / M0): the runtime's optimizer is AdamW, for which the square-root
rule keeps the update's noise the same (AdaScale's linear gain ratio is derived for SGD), and it is a
function of the batch alone, so a resume recomputes it from the batch its checkpoint holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from training import batching
from training.batching import BatchSplit
from training.config import AdaptiveBatchConfig, ConfigError
from training.efficiency import GradStats, NoiseAverage, gain


@dataclass(frozen=True)
class StepCost:
    """A step's measured seconds: `fixed_s` whatever the batch (the update, the gradient sync, the
    control exchange) and `per_example_s` for each example of a worker's share (forward, backward)."""

    fixed_s: float
    per_example_s: float

    def step_s(self, split: BatchSplit) -> float:
        return self.fixed_s + self.per_example_s * split.share


def candidates(bounds: AdaptiveBatchConfig, start: int) -> list[int]:
    """The batches a choice weighs: min x 2^k up to max, max itself, and the batch a run starts at.
    Each splits over any number of workers that splits the bounds and the start."""
    doubled = [bounds.min * 2**k for k in range(int(math.log2(bounds.max / bounds.min)) + 1)]
    return sorted({*doubled, bounds.max, start})


def choose(splits: Sequence[BatchSplit], cost: StepCost, stats: GradStats | None, start: int) -> int | None:
    """The global batch of the most goodput among `splits` (the smallest of equals); None where no
    gradient statistics tell a larger batch's worth yet."""
    if stats is None or stats.sqr + stats.var == 0:
        return None

    def goodput(split: BatchSplit) -> float:
        return gain(split.global_batch / start, stats.sqr, stats.var) / cost.step_s(split)

    return max(splits, key=lambda s: (goodput(s), -s.global_batch)).global_batch


def lr_scale(global_batch: int, start: int) -> float:
    """The square-root rule: the learning rate at `global_batch` over the one tuned at `start`."""
    return math.sqrt(global_batch / start)


class AdaptiveBatch:
    """One run's adaptive batch on one worker: the batch now, the averaged gradient statistics (both
    in the checkpoints) and the step costs measured since the last choice. Every input is the same on
    every worker (summed over them first), so each worker chooses the same batch."""

    def __init__(self, bounds: AdaptiveBatchConfig, start: int, replicas: int, micro: int | None) -> None:
        for name in ("min", "max"):
            value = getattr(bounds, name)
            if value % replicas:
                raise ConfigError(
                    f"train.adaptive_batch.{name}: {value} does not split over {replicas} data-parallel "
                    f"workers: each bound must be a multiple of the number of workers"
                )
        self.bounds = bounds
        self.start = start
        self.splits = [batching.split(b, replicas, micro) for b in candidates(bounds, start)]
        self.global_batch = start
        self.noise = NoiseAverage()
        self._reset()

    def _reset(self) -> None:
        self._steps = 0
        self._fixed_s = self._compute_s = self._examples = 0.0

    @property
    def lr_scale(self) -> float:
        return lr_scale(self.global_batch, self.start)

    def observe(self, sample: GradStats | None, step_s: float, compute_s: float, share: int) -> None:
        """One step: its gradient statistics (None: fewer than two pieces), its seconds and the part
        of them its forward and backward took, over `share` examples per worker."""
        if sample is not None:
            self.noise = self.noise.add(sample, self.bounds.smoothing)
        self._steps += 1
        self._fixed_s += step_s - compute_s
        self._compute_s += compute_s
        self._examples += share

    def due(self, step: int) -> bool:
        """Whether the batch is chosen after `step` steps."""
        return step % self.bounds.every_steps == 0

    def choose(self) -> bool:
        """Take the batch of the most goodput from the steps measured since the last choice; whether
        it changed."""
        if not self._steps:
            return False
        cost = StepCost(self._fixed_s / self._steps, self._compute_s / self._examples)
        self._reset()
        chosen = choose(self.splits, cost, self.noise.stats(), self.start)
        changed = chosen is not None and chosen != self.global_batch
        if chosen is not None:
            self.global_batch = chosen
        return changed

    def state_dict(self) -> dict[str, Any]:
        n = self.noise
        return {"global_batch": self.global_batch, "noise": [n.biased_sqr, n.biased_var, n.weight]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        batch = int(state["global_batch"])
        if batch not in (s.global_batch for s in self.splits):
            raise ConfigError(
                f"train.adaptive_batch: the checkpoint's batch {batch} is none of this run's candidates "
                f"{[s.global_batch for s in self.splits]} (were the bounds changed?)"
            )
        self.global_batch = batch
        self.noise = NoiseAverage(*state["noise"])
