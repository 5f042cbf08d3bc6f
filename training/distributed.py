"""Process groups and model wrapping: DDP or FSDP2 (`fully_shard`), NCCL on GPUs and gloo on CPU."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    checkpoint_group: dist.ProcessGroup
    """A gloo group of its own for checkpoint collectives, so an asynchronous save's background thread
    never shares a communicator with the training step."""

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init(backend: str = "auto", env: Mapping[str, str] = os.environ, timeout_s: float = 300.0) -> World:
    """Join the torchrun gang described by RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or form a group of
    one when started without torchrun."""
    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    local_rank = int(env.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda and backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "RANK" in env and "WORLD_SIZE" in env:
            dist.init_process_group(
                backend, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), timeout=timeout
            )
        else:
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, timeout=timeout
            )
    group = dist.new_group(backend="gloo", timeout=timeout)
    return World(dist.get_rank(), dist.get_world_size(), local_rank, device, group)


STRATEGIES = ("ddp", "fsdp")
"""What `wrap` does."""


def wrap(model: nn.Module, strategy: str, world: World) -> nn.Module:
    """DDP replicates the model on each rank; FSDP shards each block's parameters, gradients and optimizer
    state and gathers weights only for compute."""
    model = model.to(world.device)
    if strategy == "ddp":
        return DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None
        )
    if strategy == "fsdp":
        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"parallel.strategy: expected ddp or fsdp, got {strategy!r}")


@contextlib.contextmanager
def micro_batch(model: nn.Module, last: bool) -> Iterator[None]:
    """One micro-batch's forward and backward of a step that accumulates several (training/batching.py):
    DDP all-reduces the gradients of the step's last only (`no_sync` before it, the sum is the
    same); FSDP reduce-scatters each one's, so a rank keeps only its shard of the gradients (the
    memory FSDP is for)."""
    if not last and isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    else:
        yield


@torch.no_grad()
def scale_gradients(model: nn.Module, factor: float) -> None:
    """Multiply every gradient by `factor`: the sum over a step's micro-batches becomes their mean."""
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad.mul_(factor)


@torch.no_grad()
def average_gradients(model: nn.Module) -> None:
    """Average every gradient over the ranks: what DDP's synced micro-batch does, for a step whose
    micro-batches all stayed local (an adaptive batch measures each one's gradient)."""
    world_size = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad.div_(world_size)


@torch.no_grad()
def flat_gradient(model: nn.Module) -> torch.Tensor:
    """This rank's gradients as one float64 vector (zeros where none was computed yet)."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().flatten()
            for p in model.parameters()
        ]
    )


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few floats over all ranks (the per-step control exchange)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
