"""Checkpoint overhead: training throughput with no checkpoints, synchronous and asynchronous checkpoints
every N steps, the stall each checkpoint causes, and the restore time. 2 gloo workers on CPU (NCCL on GPU).

    .venv/bin/python benchmarks/checkpoint_overhead.py [--steps 30] [--every 10] [--width 5000] [--layers 4]

The model is the runtime's MLP (100.3M parameters at the defaults) with AdamW, wrapped in DDP; the
checkpoints go through training.checkpoint (DCP via fsspec, manifest with sha256 last). The last line is:
RESULT async_overhead=F sync_overhead=S stall_s=T restore_s=R
(overheads as fractions of the no-checkpoint throughput; stall_s: mean time an asynchronous checkpoint
blocks the training loop, after the first one which also allocates the reusable staging buffers;
restore_s: time to find, verify and load the newest checkpoint on a fresh model).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from training import distributed
from training.checkpoint import Checkpointer, CheckpointStore
from training.model import MLPClassifier, count_parameters


def _phase(model: torch.nn.Module, opt: torch.optim.Optimizer, world: distributed.World,
           args: argparse.Namespace, ckpt: Checkpointer | None,
           snapshot: list[torch.Tensor] | None = None) -> float:
    """Seconds for `args.steps` steps with a checkpoint every `args.every`, until the last one is durable."""
    g = torch.Generator().manual_seed(world.rank)
    x = torch.randn(args.batch, args.features, generator=g).to(world.device)
    y = (torch.rand(args.batch, generator=g) > 0.5).float().to(world.device)
    torch.distributed.barrier()
    start = time.perf_counter()
    untimed = 0.0
    last = (args.steps - 1) // args.every * args.every
    for step in range(1, args.steps + 1):
        loss = F.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ckpt is not None and step % args.every == 0 and step < args.steps:
            ckpt.save(step, model, opt, {"step": step}, {"loss": loss.item()}, {"mlflow_run_id": None})
            if snapshot is not None and step == last:  # what the restore must give back (not timed)
                t = time.perf_counter()
                snapshot[:] = [p.detach().clone() for p in model.parameters()]
                untimed += time.perf_counter() - t
    if ckpt is not None:
        ckpt.wait()
    if world.device.type == "cuda":
        torch.cuda.synchronize()
    torch.distributed.barrier()
    return time.perf_counter() - start - untimed


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, root: str, out: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    world = distributed.init("auto")
    torch.manual_seed(0)
    base = MLPClassifier(args.features, (args.width,) * args.layers)
    model = distributed.wrap(base, "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # Warm-up: allocate gradients and optimizer state so every phase starts from the same point.
    args_warm = argparse.Namespace(**{**vars(args), "steps": 2})
    _phase(model, opt, world, args_warm, None)

    results: dict[str, Any] = {"params": count_parameters(base)}
    results["none_s"] = _phase(model, opt, world, args, None)
    sync = Checkpointer(CheckpointStore(f"{root}/sync"), world.rank, world.world_size, world.checkpoint_group,
                        async_save=False, keep_last=1)
    results["sync_s"] = _phase(model, opt, world, args, sync)
    results["sync_stalls"] = sync.stalls_s
    asyn = Checkpointer(CheckpointStore(f"{root}/async"), world.rank, world.world_size,
                        world.checkpoint_group, async_save=True, keep_last=1)
    snapshot: list[torch.Tensor] = []
    results["async_s"] = _phase(model, opt, world, args, asyn, snapshot)
    results["async_stalls"] = asyn.stalls_s
    sync.close()
    asyn.close()

    torch.manual_seed(1)
    fresh = distributed.wrap(MLPClassifier(args.features, (args.width,) * args.layers), "ddp", world)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-4)
    torch.distributed.barrier()
    start = time.perf_counter()
    loader = Checkpointer(CheckpointStore(f"{root}/async"), world.rank, world.world_size,
                          world.checkpoint_group)
    manifest = loader.find_latest(verify_checksums=True)
    assert manifest is not None, "no complete checkpoint to restore"
    results["verify_s"] = time.perf_counter() - start
    loader.restore(manifest, fresh, fresh_opt)
    torch.distributed.barrier()
    results["restore_s"] = time.perf_counter() - start
    same = all(torch.equal(a, b) for a, b in zip(snapshot, fresh.parameters(), strict=True))
    results["restored_equal"] = same
    if rank == 0:
        out.put(results)
    distributed.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40,
                        help="training steps per phase (checkpoints at every, 2*every, ... < steps)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--width", type=int, default=5000, help="hidden width of the MLP")
    parser.add_argument("--layers", type=int, default=5,
                        help="hidden layers (5 of width 5000: 4 x 5000^2 + 64 x 5000 ~ 100M parameters)")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="rows per worker per step")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--dir", default=None, help="checkpoint root (default: a temporary folder)")
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="gpuyard-ckpt-bench-") as tmp:
        root = Path(args.dir or tmp).resolve().as_uri()
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        mp.start_processes(worker, args=(args.workers, port, args, root, out), nprocs=args.workers,
                           start_method="spawn")
        r = out.get(timeout=10)

    # Checkpoints happen at every, 2*every, ... before the last step, so the last one has `every` steps
    # to finish in the background, and the phase ends only when it is durable. Extra time per checkpoint
    # against the time of `every` plain steps gives the throughput loss at one checkpoint per `every` steps.
    n_ckpt = (args.steps - 1) // args.every
    interval = r["none_s"] * args.every / args.steps

    def overhead(kind: str) -> float:
        extra = max(0.0, r[f"{kind}_s"] - r["none_s"]) / n_ckpt
        return extra / (interval + extra)

    thr = {k: args.steps / r[f"{k}_s"] for k in ("none", "sync", "async")}
    sync_overhead, async_overhead = overhead("sync"), overhead("async")
    # The first asynchronous save also allocates the staging buffers it reuses for the rest of the run.
    steady = r["async_stalls"][1:] or r["async_stalls"]
    stall = statistics.mean(steady)
    print(f"model: {r['params'] / 1e6:.1f}M parameters, AdamW, {args.workers} workers, "
          f"{'cuda' if torch.cuda.is_available() else 'cpu'}, batch {args.batch}/worker, "
          f"{args.steps} steps/phase, checkpoint every {args.every}")
    for k in ("none", "sync", "async"):
        print(f"  {k:<6} {thr[k]:7.3f} steps/s  ({r[f'{k}_s']:.1f} s)")
    print(f"  sync stall per checkpoint:  {statistics.mean(r['sync_stalls']):.3f} s "
          f"({', '.join(f'{s:.2f}' for s in r['sync_stalls'])})")
    print(f"  async stall per checkpoint: {stall:.3f} s after the first "
          f"({', '.join(f'{s:.2f}' for s in r['async_stalls'])}; the first allocates the staging buffers)")
    print(f"  restore: {r['restore_s']:.3f} s (find newest + verify sha256 {r['verify_s']:.3f} s, "
          f"load the rest); restored weights identical: {r['restored_equal']}")
    print(f"  throughput at one checkpoint per {args.every} steps: sync -{sync_overhead:.1%}, "
          f"async -{async_overhead:.1%} (target: async <= 5%)")
    print(f"RESULT async_overhead={async_overhead:.4f} sync_overhead={sync_overhead:.4f} "
          f"stall_s={stall:.4f} restore_s={r['restore_s']:.4f}")


if __name__ == "__main__":
    main()
