"""Checkpoint overhead: training throughput with no checkpoints, synchronous and asynchronous checkpoints
every N steps, the stall each checkpoint causes, and the restore time. 2 gloo workers on CPU (NCCL on GPU).

    .venv/bin/python benchmarks/checkpoint_overhead.py [--rounds 3] [--every 10] [--width 5000] [--layers 5]

The model is the runtime's MLP (100.4M parameters at the defaults) with AdamW, wrapped in DDP; the
checkpoints go through training.checkpoint (DCP via fsspec, per-rank sha256, manifest last).

Each round runs three blocks of `every` steps, one per mode, interleaved so that a change in machine load
hits all modes alike: "none" (no checkpoint), "sync" (a synchronous checkpoint, then the steps), "async"
(an asynchronous checkpoint, then the steps while it is written; the block ends only when it is durable).
A block is exactly one checkpoint interval, so 1 - time(none) / time(mode) is the throughput lost at one
checkpoint per `every` steps. One short warm-up round (not counted) allocates gradients, optimizer state
and the asynchronous staging buffers. The last line is:

RESULT async_overhead=F sync_overhead=S stall_s=T restore_s=R

(overheads as fractions of the no-checkpoint throughput; stall_s: mean time an asynchronous checkpoint
blocks the training loop; restore_s: time to find, verify and load the newest checkpoint on a fresh model).
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

MODES = ("none", "sync", "async")


class Bench:
    def __init__(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        world: distributed.World,
        args: argparse.Namespace,
        root: str,
    ) -> None:
        self.model, self.opt, self.world, self.args = model, opt, world, args
        g = torch.Generator().manual_seed(world.rank)
        self.x = torch.randn(args.batch, args.features, generator=g).to(world.device)
        self.y = (torch.rand(args.batch, generator=g) > 0.5).float().to(world.device)
        self.ckpt = {
            mode: Checkpointer(
                CheckpointStore(f"{root}/{mode}"),
                world.rank,
                world.world_size,
                world.checkpoint_group,
                async_save=mode == "async",
                keep_last=1,
            )
            for mode in ("sync", "async")
        }
        self.step = 0
        self.snapshot: list[torch.Tensor] = []

    def block(self, mode: str, steps: int) -> float:
        """Seconds for one checkpoint interval in `mode`: checkpoint (unless "none"), then `steps` steps,
        until the checkpoint is durable."""
        torch.distributed.barrier()
        start = time.perf_counter()
        untimed = 0.0
        if mode != "none":
            self.ckpt[mode].save(self.step, self.model, self.opt, {"step": self.step}, {}, {})
            if mode == "async":  # what a restore must give back (not timed)
                t = time.perf_counter()
                self.snapshot = [p.detach().clone() for p in self.model.parameters()]
                untimed = time.perf_counter() - t
        for _ in range(steps):
            loss = F.binary_cross_entropy_with_logits(self.model(self.x), self.y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.step += 1
        if mode != "none":
            self.ckpt[mode].wait()
        if self.world.device.type == "cuda":
            torch.cuda.synchronize()
        torch.distributed.barrier()
        return time.perf_counter() - start - untimed


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, root: str, out: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(args.threads)
    world = distributed.init("auto")
    torch.manual_seed(0)
    base = MLPClassifier(args.features, (args.width,) * args.layers)
    model = distributed.wrap(base, "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    bench = Bench(model, opt, world, args, root)
    for mode in MODES:  # warm-up round, not counted
        bench.block(mode, 2)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    stalls: dict[str, list[float]] = {}
    for mode in ("sync", "async"):
        bench.ckpt[mode].stalls_s.clear()
    for _ in range(args.rounds):
        for mode in MODES:
            times[mode].append(bench.block(mode, args.every))
    for mode in ("sync", "async"):
        stalls[mode] = list(bench.ckpt[mode].stalls_s)
        bench.ckpt[mode].close()

    torch.manual_seed(1)
    fresh = distributed.wrap(MLPClassifier(args.features, (args.width,) * args.layers), "ddp", world)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-4)
    torch.distributed.barrier()
    start = time.perf_counter()
    loader = Checkpointer(
        CheckpointStore(f"{root}/async"), world.rank, world.world_size, world.checkpoint_group
    )
    manifest = loader.find_latest(verify_checksums=True)
    assert manifest is not None, "no complete checkpoint to restore"
    verify_s = time.perf_counter() - start
    loader.restore(manifest, fresh, fresh_opt)
    torch.distributed.barrier()
    restore_s = time.perf_counter() - start
    same = all(torch.equal(a, b) for a, b in zip(bench.snapshot, fresh.parameters(), strict=True))
    if rank == 0:
        out.put(
            {
                "params": count_parameters(base),
                "times": times,
                "stalls": stalls,
                "verify_s": verify_s,
                "restore_s": restore_s,
                "restored_equal": same,
            }
        )
    distributed.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds (each: `every` steps in each of the 3 modes)",
    )
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--width", type=int, default=5000, help="hidden width of the MLP")
    parser.add_argument(
        "--layers",
        type=int,
        default=5,
        help="hidden layers (5 of width 5000: 4 x 5000^2 + 64 x 5000 ~ 100M parameters)",
    )
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
        out = mp.get_context("spawn").Queue()
        mp.start_processes(
            worker, args=(args.workers, port, args, root, out), nprocs=args.workers, start_method="spawn"
        )
        r = out.get(timeout=10)

    total = {mode: sum(r["times"][mode]) for mode in MODES}
    steps = args.rounds * args.every
    overhead = {mode: 1 - total["none"] / total[mode] for mode in ("sync", "async")}
    stall = statistics.mean(r["stalls"]["async"])
    print(
        f"model: {r['params'] / 1e6:.1f}M parameters, AdamW, {args.workers} workers, "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}, batch {args.batch}/worker, "
        f"{args.rounds} rounds x {args.every} steps per mode, one checkpoint per {args.every} steps"
    )
    for mode in MODES:
        blocks = ", ".join(f"{t:.1f}" for t in r["times"][mode])
        print(f"  {mode:<6} {steps / total[mode]:7.3f} steps/s  (blocks: {blocks} s)")
    for mode in ("sync", "async"):
        print(
            f"  {mode} stall per checkpoint: {statistics.mean(r['stalls'][mode]):.3f} s "
            f"({', '.join(f'{s:.2f}' for s in r['stalls'][mode])})"
        )
    print(
        f"  restore: {r['restore_s']:.3f} s (find newest + verify sha256: {r['verify_s']:.3f} s); "
        f"restored weights identical: {r['restored_equal']}"
    )
    print(
        f"  throughput lost at one checkpoint per {args.every} steps: sync {overhead['sync']:.1%}, "
        f"async {overhead['async']:.1%} (target: async <= 5%)"
    )
    print(
        f"RESULT async_overhead={overhead['async']:.4f} sync_overhead={overhead['sync']:.4f} "
        f"stall_s={stall:.4f} restore_s={r['restore_s']:.4f}"
    )


if __name__ == "__main__":
    main()
