"""The planner's network and checkpoint arithmetic: bytes per step by kind of exchange, which exchanges
leave a node, and a checkpoint's size (benchmarks/network_budget.py prints them)."""

from __future__ import annotations

import pytest

from training.planner import (
    Fleet,
    Layout,
    ModelShape,
    Training,
    checkpoint_bytes,
    crosses_nodes,
    exchange_bytes,
    exposed_exchange_s,
    step_time,
)

# Llama-2-7B's shape (docs/planner.md), 16-bit, one sequence of 4096 tokens per micro-batch.
SHAPE = ModelShape(params=6.74e9, layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096)
TRAIN = Training()
ACTIVATIONS = 4096 * 1 * 4096 * 2  # s * b * h * 2 bytes


def layout(dp: int = 1, tp: int = 1, pp: int = 1, fsdp: bool = False, microbatches: int = 1) -> Layout:
    return Layout(dp, fsdp, tp, pp, False, microbatches)


def test_ddp_sends_a_ring_all_reduce_of_the_gradients() -> None:
    """2 x (N-1)/N x the gradients' bytes per GPU, the ring all-reduce's volume; nothing else."""
    sent = exchange_bytes(SHAPE, TRAIN, layout(dp=8))
    assert sent["dp"] == pytest.approx(2 * 7 / 8 * 6.74e9 * 2)
    assert sent["tp"] == sent["pp"] == 0.0


def test_fsdp_gathers_the_weights_twice_per_micro_batch_and_reduce_scatters_once() -> None:
    ddp = exchange_bytes(SHAPE, TRAIN, layout(dp=8))["dp"]
    assert exchange_bytes(SHAPE, TRAIN, layout(dp=8, fsdp=True))["dp"] == pytest.approx(1.5 * ddp)
    four = exchange_bytes(SHAPE, TRAIN, layout(dp=8, fsdp=True, microbatches=4))["dp"]
    assert four == pytest.approx(4.5 * ddp)  # 2 x 4 + 1 passes against DDP's 2


def test_tensor_parallel_all_reduces_activations_four_times_per_layer() -> None:
    """Megatron: two all-reduces forward and two backward per layer, each 2 x (tp-1)/tp of s*b*h."""
    sent = exchange_bytes(SHAPE, TRAIN, layout(tp=8, microbatches=8))
    assert sent["tp"] == pytest.approx(4 * ACTIVATIONS * 2 * 7 / 8 * 32 * 8)
    assert sent["dp"] == sent["pp"] == 0.0
    # With pp stages a GPU holds only its stage's layers.
    staged = exchange_bytes(SHAPE, TRAIN, layout(tp=2, pp=4, microbatches=8))
    assert staged["tp"] == pytest.approx(4 * ACTIVATIONS * 2 * 1 / 2 * 8 * 8)


def test_a_pipeline_stage_sends_activations_forward_and_gradients_back() -> None:
    sent = exchange_bytes(SHAPE, TRAIN, layout(pp=8, microbatches=8))
    assert sent["pp"] == pytest.approx(2 * ACTIVATIONS * 8)
    assert exchange_bytes(SHAPE, TRAIN, layout(tp=2, pp=4, microbatches=8))["pp"] == pytest.approx(
        2 * ACTIVATIONS / 2 * 8
    )
    # Far less than a data-parallel exchange of the same model.
    assert sent["pp"] < exchange_bytes(SHAPE, TRAIN, layout(dp=8))["dp"] / 40


def test_only_groups_larger_than_a_node_cross_nodes() -> None:
    fleet = Fleet(gpu_memory_gb=80, gpus_per_node=8, nodes=8)
    assert crosses_nodes(fleet, layout(dp=8)) == {"tp": False, "dp": False, "pp": False}
    assert crosses_nodes(fleet, layout(dp=64)) == {"tp": False, "dp": True, "pp": False}
    assert crosses_nodes(fleet, layout(dp=8, tp=8)) == {"tp": False, "dp": True, "pp": False}
    assert crosses_nodes(fleet, layout(tp=8, pp=8)) == {"tp": False, "dp": False, "pp": True}
    assert crosses_nodes(fleet, layout(dp=2, tp=4, pp=8)) == {"tp": False, "dp": False, "pp": True}
    assert crosses_nodes(fleet, layout(dp=2, tp=2, pp=2)) == {"tp": False, "dp": False, "pp": False}


def test_the_step_time_charges_a_data_parallel_exchange_on_the_link_it_crosses() -> None:
    """The same layout is slower by half its DP bytes at the slower link once its group spans nodes."""
    lay = layout(dp=16, tp=1)
    one_node = Fleet(gpu_memory_gb=80, gpus_per_node=16, nodes=1)
    two_nodes = Fleet(gpu_memory_gb=80, gpus_per_node=8, nodes=2)
    sent = exchange_bytes(SHAPE, TRAIN, lay)["dp"]
    slower = step_time(SHAPE, TRAIN, two_nodes, lay, 16) - step_time(SHAPE, TRAIN, one_node, lay, 16)
    expected = 0.5 * sent / 1e9 * (1 / two_nodes.inter_node_gbps - 1 / one_node.intra_node_gbps)
    assert slower == pytest.approx(expected)


def test_at_most_half_an_exchange_and_no_more_than_the_backward_pass_overlaps() -> None:
    """Inside a node the backward pass outlasts half the exchange; across sites (benchmarks/wan_ddp.py:
    2.7 s of exchange beside 0.36 s of compute) nearly all of the exchange shows."""
    assert exposed_exchange_s(0.2, compute_s=1.5) == pytest.approx(0.1)
    assert exposed_exchange_s(2.7, compute_s=0.36) == pytest.approx(2.7 - 0.24)
    assert exposed_exchange_s(0.0, compute_s=1.0) == 0.0


@pytest.mark.parametrize(
    ("optimizer", "precision", "per_param"),
    [("adamw", "bf16", 14.0), ("adamw", "fp32", 12.0), ("sgd", "fp32", 8.0)],
)
def test_a_checkpoint_holds_the_weights_and_the_optimizer_state(
    optimizer: str, precision: str, per_param: float
) -> None:
    """Mixed-precision AdamW: 2-byte weights + 8 bytes of moments + a 4-byte fp32 master copy."""
    assert checkpoint_bytes(7e9, optimizer, precision) == pytest.approx(7e9 * per_param)  # type: ignore[arg-type]
