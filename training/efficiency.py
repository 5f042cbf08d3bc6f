"""Statistical efficiency of a larger batch, as Pollux (OSDI'21) models it: what one step at a larger
global batch is worth, from the gradient's squared norm and its noise. One definition for the
runtime's adaptive batch (training/adaptive.py) and the Pollux replay (gpuyard.sim.elastic).

`grad_sqr` is |E g|^2, the true gradient's squared norm; `grad_var` is the variance (the trace of the
covariance) of the gradient of a batch of `M0` examples, the batch progress is counted in. A step at
`scale = M / M0` times that batch is worth `gain(scale)` steps at M0: `scale` where the noise dominates
(averaging more examples is as good as taking more steps), 1 where the signal does (a larger batch
only repeats what a small one already knows). The statistical efficiency `gain / scale` is 1 at M0.

Torch-free: the replay imports it without the runtime's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass


def gain(scale: float, grad_sqr: float, grad_var: float) -> float:
    """Progress of one step at `scale` times the initial batch, in steps at the initial batch:
    (var + sqr) / (var / scale + sqr)."""
    return (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)


@dataclass(frozen=True)
class GradStats:
    """The gradient's squared norm and its variance at the initial batch."""

    sqr: float
    var: float


def estimate(piece_sqr: float, mean_sqr: float, pieces: int, piece_batch: int, init_batch: int) -> GradStats:
    """The gradient's statistics from one step's `pieces` equal pieces of `piece_batch` examples each
    (AdaptDL's estimator): `piece_sqr` the mean over the pieces of each piece gradient's squared norm,
    `mean_sqr` the squared norm of their mean. With sigma^2 the per-example variance,
    E piece_sqr = sqr + sigma^2 / b and E mean_sqr = sqr + sigma^2 / (n b), which these invert; the
    variance is given at `init_batch` (sigma^2 / M0). Unbiased, so either may come out below 0 on one
    step: the moving average (`NoiseAverage`) smooths them."""
    if pieces < 2:
        raise ValueError(f"pieces: the noise needs at least 2 piece gradients, got {pieces}")
    sigma2 = (piece_sqr - mean_sqr) * pieces * piece_batch / (pieces - 1)
    return GradStats((pieces * mean_sqr - piece_sqr) / (pieces - 1), sigma2 / init_batch)


@dataclass(frozen=True)
class NoiseAverage:
    """An exponential moving average of the per-step estimates, bias-corrected (as Adam's moments):
    `biased_*` sum `(1 - smoothing) * smoothing^age` over the estimates, `weight` sums those factors."""

    biased_sqr: float = 0.0
    biased_var: float = 0.0
    weight: float = 0.0

    def add(self, sample: GradStats, smoothing: float) -> NoiseAverage:
        keep, take = smoothing, 1.0 - smoothing
        return NoiseAverage(
            keep * self.biased_sqr + take * sample.sqr,
            keep * self.biased_var + take * sample.var,
            keep * self.weight + take,
        )

    def stats(self) -> GradStats | None:
        """The average, each term at least 0 (None before any estimate)."""
        if self.weight == 0:
            return None
        return GradStats(max(self.biased_sqr / self.weight, 0.0), max(self.biased_var / self.weight, 0.0))
