"""One gang of ranks that trains the transformer in every layout in turn (`python
tests/training/layouts_gang.py OUT`, each rank started as torchrun starts it): each rank writes
`OUT/rankN.json`, per layout the loss of each step and the shapes of the parameters it holds. The
same steps in one process without torch.distributed: `reference_losses`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from training.layouts import LayoutSpec, parallelize
from training.transformer import Transformer, TransformerSpec, next_token_loss, synthetic_tokens

MODEL = TransformerSpec(vocab=64, width=64, heads=4, layers=4, seq_len=16)
STEPS, BATCH, SEED, LR = 4, 8, 7, 1e-2
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


def train(spec: LayoutSpec) -> dict[str, object]:
    torch.manual_seed(SEED)  # every rank starts from the same full model
    parallel = parallelize(Transformer(MODEL), spec)
    optimizer = torch.optim.AdamW(parallel.model.parameters(), lr=LR)
    losses = [parallel.step(tokens, optimizer) for tokens in batches()]
    held = {
        name: list((p.to_local() if isinstance(p, DTensor) else p).shape)
        for name, p in parallel.model.named_parameters()
    }
    return {"losses": losses, "held": held}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    found = {label: train(spec) for label, spec in LAYOUTS.items()}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
