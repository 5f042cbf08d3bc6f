"""Gangs of ranks that train the transformer in the parallel layouts and resume it, through the
runtime's checkpoints (training/checkpoint.py: DCP, resharded by parameter names); each rank started
as torchrun starts it, writing `OUT/<gang>-rankN.json`:

    python tests/training/layouts_gang.py OUT four   # 4 ranks: every layout, and its exact resume
    python tests/training/layouts_gang.py OUT two    # 2 ranks, after `four`: resumes across layouts

`four`, per layout: STEPS steps from the seed, saving a checkpoint after HALF; then a fresh model in
the same layout restores it and trains the second half again. It records both runs' losses, whether
the second half came out bit for bit (losses and every parameter this rank holds, `torch.equal`),
and the shapes of what the rank holds. `two`, per pair of `ACROSS`: the first half in one layout,
the second resumed from its checkpoint in another (the last pair from `four`'s 4-rank FSDP x TP
checkpoint). `reference_losses`: the same steps in one process without torch.distributed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from training.checkpoint import Checkpointer, CheckpointStore
from training.layouts import LayoutSpec, Parallel, parallelize
from training.transformer import Transformer, TransformerSpec, next_token_loss, synthetic_tokens

MODEL = TransformerSpec(vocab=64, width=64, heads=4, layers=4, seq_len=16)
STEPS, HALF, BATCH, SEED, LR = 6, 3, 8, 7, 1e-2
RANKS = 4
LAYOUTS = {  # label -> the layout on RANKS ranks
    "ddp": LayoutSpec("ddp"),
    "fsdp": LayoutSpec("fsdp"),
    "tp": LayoutSpec("tp"),
    "pp_1f1b": LayoutSpec("pp", schedule="1f1b"),
    "pp_gpipe": LayoutSpec("pp", schedule="gpipe"),
    "fsdp_tp": LayoutSpec("fsdp_tp", tp=2),
    "pp_dp": LayoutSpec("pp_dp", pp=2),
}
ACROSS = {  # label -> (saved by, on how many ranks; resumed by, on 2)
    "ddp2_to_fsdp2": ("ddp", 2, "fsdp"),
    "fsdp2_to_tp2": ("fsdp", 2, "tp"),
    "pp2_to_ddp2": ("pp", 2, "ddp"),
    "fsdp_tp4_to_fsdp2": ("fsdp_tp", 4, "fsdp"),
}


def batches() -> list[torch.Tensor]:
    return list(synthetic_tokens(MODEL, STEPS * BATCH, SEED + 1).split(BATCH))


def reference_losses() -> list[float]:
    torch.manual_seed(SEED)
    model = Transformer(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for tokens in batches():
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


class Run:
    """One layout's model and optimizer, from the seed's full model, checkpointing under `root`."""

    def __init__(self, spec: LayoutSpec, root: Path, group: dist.ProcessGroup):
        torch.manual_seed(SEED)  # every rank starts from the same full model
        self.parallel: Parallel = parallelize(Transformer(MODEL), spec)
        self.optimizer = torch.optim.AdamW(self.parallel.model.parameters(), lr=LR)
        self.checkpoints = Checkpointer(
            CheckpointStore(root.as_uri()), dist.get_rank(), dist.get_world_size(), group
        )

    def train(self, steps: range) -> list[float]:
        return [self.parallel.step(batches()[step], self.optimizer) for step in steps]

    def save(self, step: int) -> None:
        self.checkpoints.save(step, self.parallel.model, self.optimizer, {}, {}, {})

    def resume(self) -> int:
        manifest = self.checkpoints.find_latest()
        assert manifest is not None, "no checkpoint to resume from"
        self.checkpoints.restore(manifest, self.parallel.model, self.optimizer)
        return manifest.step

    def held(self) -> dict[str, torch.Tensor]:
        return {
            name: (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in self.parallel.model.named_parameters()
        }


def exact_resume(spec: LayoutSpec, root: Path, group: dist.ProcessGroup) -> dict[str, Any]:
    first = Run(spec, root, group)
    losses = first.train(range(HALF))
    first.save(HALF)
    losses += first.train(range(HALF, STEPS))
    second = Run(spec, root, group)
    resumed = second.train(range(second.resume(), STEPS))
    held, again = first.held(), second.held()
    return {
        "losses": losses,
        "resumed": resumed,
        "bit_for_bit": resumed == losses[HALF:] and all(torch.equal(held[n], again[n]) for n in held),
        "held": {name: list(tensor.shape) for name, tensor in held.items()},
    }


def main(out: Path, gang: str) -> None:
    dist.init_process_group("gloo")
    group = dist.new_group(backend="gloo")  # the checkpoints' own, as the runtime's (distributed.World)
    found: dict[str, Any] = {}
    if gang == "four":
        found = {label: exact_resume(spec, out / "ckpt" / label, group) for label, spec in LAYOUTS.items()}
    else:
        for label, (saved_by, ranks, resumed_by) in ACROSS.items():
            root = out / "ckpt" / (saved_by if ranks == 4 else label)
            if ranks == 2:
                first = Run(LayoutSpec(saved_by), root, group)
                first.train(range(HALF))
                first.save(HALF)
            second = Run(LayoutSpec(resumed_by), root, group)
            found[label] = second.train(range(second.resume(), STEPS))
    (out / f"{gang}-rank{dist.get_rank()}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
