"""How a step's fixed global batch splits over a gang of any size: each worker's micro-batch and the
micro-batches it accumulates before the optimizer steps.

An elastic job (`resources.gpus: {min, max}`) runs the same training at every size: the global batch
G stays `train.global_batch_size`, and W data-parallel workers each take G / W examples of it, in
`accum_steps` micro-batches of `local_batch` (W x local_batch x accum_steps = G). The micro-batch is
the largest divisor of the worker's share within `train.micro_batch_size` (null: the whole share at
once), so the split is a function of (G, W, the bound) alone. The examples of a step are a function
of the step alone (`data.StepSampler`, `workloads.step_tokens`), and the gradient of a step is the
mean over all G examples whatever W (`workloads`: summed over the micro-batches, divided by their
number, averaged over the workers), so a run checkpointed on W workers and resumed on W' computes the
same steps, up to the order of floating-point sums.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.config import ConfigError

SHOWN_SIZES = 12  # the sizes an error lists


@dataclass(frozen=True)
class BatchSplit:
    """One step's global batch over `replicas` data-parallel workers."""

    global_batch: int
    replicas: int
    local_batch: int  # each worker's micro-batch: the examples of one forward and backward
    accum_steps: int  # micro-batches per worker per optimizer step

    @property
    def share(self) -> int:
        """Each worker's examples per step."""
        return self.local_batch * self.accum_steps


def sizes(global_batch: int) -> list[int]:
    """The numbers of data-parallel workers a global batch splits over: its divisors."""
    return [n for n in range(1, global_batch + 1) if global_batch % n == 0]


def split(global_batch: int, replicas: int, micro_batch_size: int | None = None) -> BatchSplit:
    """The split of `global_batch` over `replicas` workers whose micro-batch is at most
    `micro_batch_size` (None: no bound). A ConfigError names the field when the gang cannot take the
    batch."""
    if replicas < 1:
        raise ValueError(f"replicas: expected >= 1, got {replicas}")
    if global_batch % replicas:
        fits = sizes(global_batch)
        shown = ", ".join(map(str, fits[:SHOWN_SIZES])) + (", ..." if len(fits) > SHOWN_SIZES else "")
        raise ConfigError(
            f"train.global_batch_size: {global_batch} does not split over {replicas} data-parallel "
            f"workers: the global batch stays fixed at every size of a job, so it runs only on a number "
            f"of data-parallel workers that divides it ({shown})"
        )
    share = global_batch // replicas
    bound = share if micro_batch_size is None else min(micro_batch_size, share)
    local = next(b for b in range(bound, 0, -1) if share % b == 0)  # 1 divides any share
    return BatchSplit(global_batch, replicas, local, share // local)
