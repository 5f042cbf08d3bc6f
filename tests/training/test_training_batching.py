"""The fixed global batch at any gang size (training/batching.py): the split rule, the sizes it
refuses, and micro-batches that leave the gradient of the whole batch (in one process: no workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from training import distributed, workloads
from training.batching import BatchSplit, split
from training.config import ConfigError, from_dict
from training.layouts import LayoutSpec


@pytest.mark.parametrize(
    ("global_batch", "replicas", "bound", "local", "accum"),
    [
        (32, 1, 8, 8, 4),  # the resize test's three sizes: 1, 2, 4 workers of at most 8
        (32, 2, 8, 8, 2),
        (32, 4, 8, 8, 1),
        (32, 2, None, 16, 1),  # no bound: the whole share at once (the runtime before elastic jobs)
        (32, 2, 64, 16, 1),  # a bound above the share changes nothing
        (24, 2, 5, 4, 3),  # the largest divisor of the share (12) within the bound
        (14, 2, 3, 1, 7),  # a share whose only divisor within the bound is 1
    ],
)
def test_each_worker_takes_its_share_in_the_largest_micro_batches_within_the_bound(
    global_batch: int, replicas: int, bound: int | None, local: int, accum: int
) -> None:
    found = split(global_batch, replicas, bound)
    assert found == BatchSplit(global_batch, replicas, local, accum)
    assert replicas * found.local_batch * found.accum_steps == global_batch


def test_a_size_that_does_not_divide_the_global_batch_is_refused_naming_the_sizes_that_do() -> None:
    with pytest.raises(ConfigError) as caught:
        split(32, 3, 8)
    assert str(caught.value) == (
        "train.global_batch_size: 32 does not split over 3 data-parallel workers: the global batch stays "
        "fixed at every size of a job, so it runs only on a number of data-parallel workers that divides "
        "it (1, 2, 4, 8, 16, 32)"
    )
    with pytest.raises(ConfigError, match=r"\(1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15, 16, \.\.\.\)$"):
        split(720, 7)


def test_the_micro_batch_bound_is_a_validated_field() -> None:
    with pytest.raises(ConfigError, match=r"^train.micro_batch_size: expected >= 1 or null, got 0$"):
        from_dict({"data": {"path": "/d"}, "train": {"micro_batch_size": 0}})


def test_a_pipeline_takes_no_micro_batch_bound_and_other_layouts_split_over_their_replicas() -> None:
    model = from_dict({"model": {"kind": "transformer"}}).model
    with pytest.raises(ConfigError, match=r"^train.micro_batch_size: a pipeline accumulates"):
        workloads.check_layout(LayoutSpec("pp"), model, 2, 8, micro_batch_size=2)
    assert workloads.check_layout(LayoutSpec("fsdp_tp", tp=2), model, 4, 8, 2) == BatchSplit(8, 2, 2, 2)
    assert workloads.check_layout(LayoutSpec("tp"), model, 4, 8, 2) == BatchSplit(8, 1, 2, 4)
    refused = r"^train.global_batch_size: 6 .* \(parallel.strategy ddp on 4 ranks\)$"
    with pytest.raises(ConfigError, match=refused):
        workloads.check_layout(LayoutSpec("ddp"), model, 4, 6)


@pytest.fixture(scope="module")
def world() -> Iterator[distributed.World]:
    w = distributed.init("gloo", env={})
    yield w
    distributed.shutdown()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
        for name, p in model.named_parameters()
    }


@pytest.mark.parametrize(
    ("kind", "strategy"), [("mlp", "ddp"), ("mlp", "fsdp"), ("transformer", "ddp"), ("transformer", "fsdp")]
)
def test_micro_batches_leave_the_gradient_and_loss_of_the_whole_batch(
    world: distributed.World, flights_parquet: Path, kind: str, strategy: str
) -> None:
    """A step of 32 examples in 1, 4 (bound 8) and 8 (bound 5: micro-batches of 4) micro-batches: the
    same mean loss and gradient, up to the order of float32 sums."""
    raw: dict[str, Any] = {"seed": 7, "parallel": {"strategy": strategy}, "train": {"global_batch_size": 32}}
    if kind == "mlp":
        raw |= {"data": {"path": str(flights_parquet)}, "model": {"hidden": [16, 16]}}
    else:
        raw |= {"model": {"kind": "transformer", "width": 16, "heads": 2, "layers": 2, "seq_len": 8}}
    found = {}
    for bound in (None, 8, 5):
        cfg = from_dict({**raw, "train": {**raw["train"], "micro_batch_size": bound}})
        workload = workloads.build(cfg, world)
        loss_rows, rows = workload.forward_backward(3)
        found[bound] = (workload.split.accum_steps, loss_rows / rows, gradients(workload.model))
    (one, whole, expected) = found[None]
    assert one == 1 and [found[b][0] for b in (8, 5)] == [4, 8]
    for bound in (8, 5):
        _, loss, grads = found[bound]
        assert loss == pytest.approx(whole, rel=1e-6)
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
