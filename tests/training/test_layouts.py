"""The transformer in every parallel layout (training/layouts.py) on gangs of CPU ranks (gloo,
tests/training/layouts_gang.py), checkpointed and resumed through the runtime's checkpoints:

- with dropout 0, each layout's loss per step is within a relative 1e-5 of one process's from the same
  seed and global batches (the same sums in another order, fp32);
- each rank holds what its layout says: a shard, a slice of the heads, a pipeline stage's layers under
  the full model's names;
- a checkpoint resumed in the same layout on as many ranks continues bit for bit (`torch.equal`), and
  one resumed in another layout, on as many or fewer ranks, continues as if uninterrupted, within the
  same 1e-5.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import layouts_gang as gang
import pytest
from trainkit import start_gang

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # relative, per step
WIDTH, LAYERS = gang.MODEL.width, gang.MODEL.layers


@pytest.fixture(scope="module")
def gangs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, Any]]]]:
    """What each rank of the `four` gang, then of the `two` gang (resuming the first's checkpoint), wrote."""
    out = tmp_path_factory.mktemp("layouts")
    found = {}
    for name, ranks in (("four", gang.RANKS), ("two", 2)):
        workers = start_gang([sys.executable, gang.__file__, str(out), name], ranks, out)
        assert workers.wait(timeout=300) == [0] * ranks, workers.output()
        found[name] = [json.loads((out / f"{name}-rank{rank}.json").read_text()) for rank in range(ranks)]
    yield found


@pytest.fixture(scope="module")
def reference() -> list[float]:
    losses = gang.reference_losses()
    assert losses[-1] < losses[0]  # it learns: the comparisons are not of untrained noise
    return losses


def assert_close(losses: list[float], reference: list[float], what: str) -> None:
    gaps = [abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True)]
    assert max(gaps) <= TOLERANCE, f"{what}: {losses} against one process's {reference}"


@pytest.mark.parametrize("label", sorted(gang.LAYOUTS))
def test_each_layout_computes_what_one_process_computes_and_resumes_bit_for_bit(
    label: str, gangs: dict[str, list[dict[str, Any]]], reference: list[float]
) -> None:
    for rank, found in enumerate(gangs["four"]):
        assert_close(found[label]["losses"], reference, f"{label}, rank {rank}")
        assert found[label]["bit_for_bit"], f"{label}, rank {rank}: {found[label]['resumed']}"


@pytest.mark.parametrize("label", sorted(gang.ACROSS))
def test_a_checkpoint_resumes_in_another_layout_as_if_uninterrupted(
    label: str, gangs: dict[str, list[dict[str, Any]]], reference: list[float]
) -> None:
    for rank, found in enumerate(gangs["two"]):
        assert_close(found[label], reference[gang.HALF :], f"{label}, rank {rank}")


def test_fsdp_shards_every_parameter_and_ddp_replicates_it(gangs: dict[str, list[dict[str, Any]]]) -> None:
    for found in gangs["four"]:
        assert found["fsdp"]["held"]["layers.0.feed_forward.w1.weight"] == [4 * WIDTH // gang.RANKS, WIDTH]
        assert found["ddp"]["held"]["module.layers.0.feed_forward.w1.weight"] == [4 * WIDTH, WIDTH]


def test_tensor_parallelism_holds_a_slice_of_the_heads_and_of_the_mlp(
    gangs: dict[str, list[dict[str, Any]]],
) -> None:
    for found in gangs["four"]:
        held = found["tp"]["held"]
        assert held["layers.0.attention.wq.weight"] == [WIDTH // gang.RANKS, WIDTH]  # column-parallel
        assert held["layers.0.attention.wo.weight"] == [WIDTH, WIDTH // gang.RANKS]  # row-parallel
        assert held["layers.0.feed_forward.w2.weight"] == [WIDTH, 4 * WIDTH // gang.RANKS]
        # FSDP x TP (2 x 2): the TP slice of 2, sharded again over 2
        assert found["fsdp_tp"]["held"]["layers.0.attention.wq.weight"] == [WIDTH // 4, WIDTH]


def test_a_pipeline_stage_holds_its_layers_under_the_full_models_names(
    gangs: dict[str, list[dict[str, Any]]],
) -> None:
    for rank, found in enumerate(gangs["four"]):
        held = found["pp_1f1b"]["held"]
        assert {name.split(".")[1] for name in held if name.startswith("layers.")} == {str(rank)}
        assert ("tok_embeddings.weight" in held) == (rank == 0)
        assert ("output.weight" in held) == (rank == LAYERS - 1)
        # PP x DP (2 stages x 2): ranks 0, 1 are stage 0's replicas (the mesh is (pp, dp))
        stage = {name.split(".")[1] for name in found["pp_dp"]["held"] if name.startswith("layers.")}
        assert stage == ({"0", "1"} if rank < 2 else {"2", "3"})
