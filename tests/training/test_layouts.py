"""The transformer trained in every parallel layout (training/layouts.py) on one gang of four CPU
ranks (gloo) computes what one process computes: with dropout 0, each step's loss within a relative
1e-5 of the single-process run from the same seed and global batches; and each rank holds what its
layout says (a shard, a slice of the heads, a pipeline stage's layers under the full model's names)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import layouts_gang as gang
import pytest
from trainkit import start_gang

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # relative, per step: the same sums in another order (fp32)
WIDTH, LAYERS = gang.MODEL.width, gang.MODEL.layers


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("layouts")
    workers = start_gang([sys.executable, gang.__file__, str(out)], gang.RANKS, out)
    codes = workers.wait(timeout=300)
    assert codes == [0] * gang.RANKS, workers.output()
    yield [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(gang.RANKS)]


@pytest.fixture(scope="module")
def reference() -> list[float]:
    return gang.reference_losses()


@pytest.mark.parametrize("label", sorted(gang.LAYOUTS))
def test_each_layout_computes_what_one_process_computes(
    label: str, trained: list[dict[str, Any]], reference: list[float]
) -> None:
    for rank, found in enumerate(trained):
        losses = found[label]["losses"]
        gaps = [abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True)]
        assert max(gaps) <= TOLERANCE, f"rank {rank}: {losses} against one process's {reference}"
    assert reference[-1] < reference[0]  # it learns: the comparison is not of untrained noise


def test_fsdp_shards_every_parameter_and_ddp_replicates_it(trained: list[dict[str, Any]]) -> None:
    for found in trained:
        assert found["fsdp"]["held"]["layers.0.feed_forward.w1.weight"] == [4 * WIDTH // gang.RANKS, WIDTH]
        assert found["ddp"]["held"]["module.layers.0.feed_forward.w1.weight"] == [4 * WIDTH, WIDTH]


def test_tensor_parallelism_holds_a_slice_of_the_heads_and_of_the_mlp(trained: list[dict[str, Any]]) -> None:
    for found in trained:
        held = found["tp"]["held"]
        assert held["layers.0.attention.wq.weight"] == [WIDTH // gang.RANKS, WIDTH]  # column-parallel
        assert held["layers.0.attention.wo.weight"] == [WIDTH, WIDTH // gang.RANKS]  # row-parallel
        assert held["layers.0.feed_forward.w2.weight"] == [WIDTH, 4 * WIDTH // gang.RANKS]
        # FSDP x TP (2 x 2): the TP slice of 2, sharded again over 2
        assert found["fsdp_tp"]["held"]["layers.0.attention.wq.weight"] == [WIDTH // 4, WIDTH]


def test_a_pipeline_stage_holds_its_layers_under_the_full_model_s_names(
    trained: list[dict[str, Any]],
) -> None:
    for rank, found in enumerate(trained):
        layers = {name.split(".")[1] for name in found["pp_1f1b"]["held"] if name.startswith("layers.")}
        assert layers == {str(rank)}  # 4 layers over 4 stages
        names = set(found["pp_1f1b"]["held"])
        assert ("tok_embeddings.weight" in names) == (rank == 0)
        assert ("output.weight" in names) == (rank == LAYERS - 1)
        # PP x DP (2 stages x 2): ranks 0, 1 are stage 0's replicas (the mesh is (pp, dp))
        stage = {name.split(".")[1] for name in found["pp_dp"]["held"] if name.startswith("layers.")}
        assert stage == ({"0", "1"} if rank < 2 else {"2", "3"})
