"""Parallel layouts of the transformer (training/transformer.py) over a gang's ranks: what each rank
holds and how one training step runs on it. A layout is an entry of `LAYOUTS`; a new one is an
addition.

- `ddp`: the whole model on every rank, the batch split, gradients averaged (in float64 unless
  `exact` is off: see `_float64_mean`);
- `fsdp`: FSDP2 (`fully_shard`): each block's parameters, gradients and optimizer state sharded;
- `tp`: tensor parallelism with sequence parallelism (`parallelize_module`): attention's and the MLP's
  projections column- then row-parallel, the norms and the residual stream sharded by sequence;
- `pp`: pipeline parallelism (`torch.distributed.pipelining`, 1F1B or GPipe over micro-batches): each
  rank a stage, the full model with the other stages' layers deleted, so names stay the full model's;
- `fsdp_tp`: TP inside groups of `tp` ranks, FSDP across them, on a 2-D mesh (dp, tp);
- `pp_dp`: stages across `pp` ranks, each stage's replicas sharded by FSDP, on a 2-D mesh (pp, dp).

Every layout takes the same global batch each step, and `Parallel.step` returns the global batch's
mean loss on every rank: the same computation as one process, up to the order of floating-point sums
(`Parallel.evaluate`: the same, forward only). `from_plan` is the layout that runs a plan of the
planner (training/planner.py), for the runtime's `strategy: auto`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from training import planner
from training.config import ConfigError
from training.transformer import Transformer, next_token_loss

SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}  # of torch.distributed.pipelining


@dataclass(frozen=True)
class LayoutSpec:
    name: str
    tp: int = 1  # ranks per tensor-parallel group (fsdp_tp)
    pp: int = 1  # pipeline stages (pp_dp)
    micro_batches: int | None = None  # a pipeline's; at least its stages [as many]
    schedule: str = "1f1b"
    # DDP: gradients averaged in float64, so that a resumed run repeats the uninterrupted one bit for
    # bit (`_float64_mean`); the price, twice the bytes and a float64 copy of each bucket in flight
    exact: bool = True


@dataclass
class Parallel:
    """This rank's part of the model, and one training step on its share of a global batch: forward,
    backward, and the global mean loss (summed over the ranks from each one's `weight`)."""

    model: nn.Module
    forward_backward: Callable[[torch.Tensor], torch.Tensor | None]  # the global batch -> its loss here
    weight: float  # this rank's loss counts this much in the global mean (0: it computes none)
    forward: Callable[[torch.Tensor], torch.Tensor | None]  # the same, without gradients

    def step(self, tokens: torch.Tensor, optimizer: torch.optim.Optimizer) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(tokens)
        optimizer.step()
        return self._global_mean(loss)

    def evaluate(self, tokens: torch.Tensor) -> float:
        """The global batch's mean loss in eval mode (no dropout), without gradients: a collective."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                loss = self.forward(tokens)
        finally:
            self.model.train(was_training)
        return self._global_mean(loss)

    def _global_mean(self, loss: torch.Tensor | None) -> float:
        mine = torch.tensor(0.0 if loss is None else float(loss.detach()) * self.weight, dtype=torch.float64)
        dist.all_reduce(mine)
        return float(mine)


Layout = Callable[[Transformer, LayoutSpec], Parallel]
LAYOUTS: dict[str, Layout] = {}


def layout(name: str) -> Callable[[Layout], Layout]:
    def register(function: Layout) -> Layout:
        LAYOUTS[name] = function
        return function

    return register


def parallelize(model: Transformer, spec: LayoutSpec) -> Parallel:
    """`model`: the full model, initialized alike on every rank (the same seed)."""
    if spec.name not in LAYOUTS:
        raise ValueError(
            f"parallel.strategy: expected one of {', '.join(sorted(LAYOUTS))}, got {spec.name!r}"
        )
    if spec.schedule not in SCHEDULES:
        raise ValueError(f"parallel.schedule: expected one of {', '.join(SCHEDULES)}, got {spec.schedule!r}")
    return LAYOUTS[spec.name](model, spec)


LAYOUT_FIELDS = {"tp": ("fsdp_tp",), "pp": ("pp_dp",), "micro_batches": ("pp", "pp_dp")}
"""The LayoutSpec fields a config sets (`parallel.*`), and the layouts that read each."""


def degrees(spec: LayoutSpec, world_size: int) -> tuple[int, int, int]:
    """(dp, tp, pp): how the layout splits `world_size` ranks into data-parallel replicas (or shards),
    tensor-parallel groups and pipeline stages."""
    tp = {"tp": world_size, "fsdp_tp": spec.tp}.get(spec.name, 1)
    pp = {"pp": world_size, "pp_dp": spec.pp}.get(spec.name, 1)
    return world_size // (tp * pp), tp, pp


def from_plan(plan: planner.Layout, schedule: str = "1f1b") -> LayoutSpec:
    """The layout of `LAYOUTS` that runs the planner's `plan` (`strategy: auto`):

    - data parallelism alone: `ddp`, or `fsdp` when the plan shards the replicas;
    - a tensor-parallel group: `tp` over every rank, or `fsdp_tp` with replicas;
    - pipeline stages: `pp` over every rank, or `pp_dp` with replicas, on the plan's micro-batches.

    The 2-D layouts shard their replicas (FSDP), so a plan that replicates them runs holding less per
    rank than planned. Tensor and pipeline parallelism together, and activation checkpointing, are no
    layout of the runtime's: a ConfigError names the plan."""
    shape = f"dp={plan.dp}, fsdp={plan.fsdp}, tp={plan.tp}, pp={plan.pp}"
    if plan.tp > 1 and plan.pp > 1:
        raise ConfigError(
            f"parallel.strategy auto: the planner chose {shape} (tensor x pipeline parallel), which no "
            f"layout of the runtime runs; name one of {', '.join(LAYOUTS)}"
        )
    if plan.activation_checkpointing:
        raise ConfigError(
            f"parallel.strategy auto: the planner's {shape} needs activation checkpointing to fit, which "
            "the runtime's layouts do not do; name a layout, or train on more ranks"
        )
    if plan.tp > 1:
        return LayoutSpec("tp") if plan.dp == 1 else LayoutSpec("fsdp_tp", tp=plan.tp)
    if plan.pp > 1:
        if plan.dp == 1:
            return LayoutSpec("pp", micro_batches=plan.microbatches, schedule=schedule)
        return LayoutSpec("pp_dp", pp=plan.pp, micro_batches=plan.microbatches, schedule=schedule)
    return LayoutSpec("fsdp" if plan.fsdp else "ddp")


def _share(tokens: torch.Tensor, index: int, of: int) -> torch.Tensor:
    """Data parallelism's split of a global batch: rank `index` of `of` takes an equal slice."""
    if tokens.shape[0] % of:
        raise ValueError(f"global batch {tokens.shape[0]} does not split over {of} data-parallel ranks")
    return tokens.chunk(of)[index]


def _data_parallel(model: nn.Module, share: Callable[[torch.Tensor], torch.Tensor], of: int) -> Parallel:
    def forward(tokens: torch.Tensor) -> torch.Tensor:
        mine = share(tokens)
        return next_token_loss(model(mine), mine)

    def forward_backward(tokens: torch.Tensor) -> torch.Tensor:
        loss = forward(tokens)
        loss.backward()
        return loss

    return Parallel(model, forward_backward, 1.0 / of, forward)


def _float64_mean(
    group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's gradient average, summed in float64: the sum of a few float32 values is then exact (unless
    their magnitudes lie 2^27 apart), so it no longer depends on where a gradient sits in its bucket.
    DDP rebuilds its buckets after its first step, and a ring all-reduce sums each chunk of a bucket in
    another rank order: without this a resumed DDP (default buckets for one step) drifts from the run
    it resumes in the last bits. The price: twice the bytes on the wire."""
    buffer = bucket.buffer()
    wide = buffer.double().div_(dist.get_world_size(group))
    work = dist.all_reduce(wide, group=group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda done: buffer.copy_(done.value()[0]))


# DDP checks a hook's annotations as objects; this module's are strings (postponed evaluation).
_float64_mean.__annotations__ = typing.get_type_hints(_float64_mean)


@layout("ddp")
def ddp(model: Transformer, spec: LayoutSpec) -> Parallel:
    rank, size = dist.get_rank(), dist.get_world_size()
    replicated = DistributedDataParallel(
        model, gradient_as_bucket_view=True
    )  # no second copy of the gradients
    if spec.exact:
        replicated.register_comm_hook(None, _float64_mean)
    return _data_parallel(replicated, lambda t: _share(t, rank, size), size)


def _shard_blocks(model: Transformer, mesh: DeviceMesh) -> None:
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


@layout("fsdp")
def fsdp(model: Transformer, spec: LayoutSpec) -> Parallel:
    size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    _shard_blocks(model, mesh)
    return _data_parallel(model, lambda t: _share(t, mesh.get_local_rank(), size), size)


def _tensor_parallel(model: Transformer, mesh: DeviceMesh) -> None:
    """Megatron's split with sequence parallelism: between blocks the residual stream is sharded by
    sequence (dim 1); each block gathers it for the column-parallel projections and reduce-scatters
    the row-parallel ones' output back."""
    for heads in (model.spec.heads, model.spec.vocab, model.spec.seq_len):
        if heads % mesh.size():
            raise ValueError(f"tensor parallelism over {mesh.size()} ranks: {heads} does not divide")
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for block in model.layers.values():
        parallelize_module(
            block,
            mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": gathered,
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": gathered,
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )


@layout("tp")
def tp(model: Transformer, spec: LayoutSpec) -> Parallel:
    size = dist.get_world_size()
    _tensor_parallel(model, init_device_mesh("cpu", (size,)))
    return _data_parallel(model, lambda t: t, size)  # every rank the whole batch: the same loss


@layout("fsdp_tp")
def fsdp_tp(model: Transformer, spec: LayoutSpec) -> Parallel:
    dp = dist.get_world_size() // spec.tp
    mesh = init_device_mesh("cpu", (dp, spec.tp), mesh_dim_names=("dp", "tp"))
    _tensor_parallel(model, mesh["tp"])
    _shard_blocks(model, mesh["dp"])
    index = mesh["dp"].get_local_rank()
    return _data_parallel(model, lambda t: _share(t, index, dp), dp * spec.tp)


def stage_of(model: Transformer, stage: int, stages: int) -> Transformer:
    """The full model with every other stage's layers deleted (the embeddings stay with the first
    stage, the norm and head with the last): its parameters keep the full model's names."""
    keys = list(model.layers)
    if len(keys) < stages:
        raise ValueError(f"{stages} pipeline stages need at least as many layers, the model has {len(keys)}")
    bounds = [round(i * len(keys) / stages) for i in range(stages + 1)]
    for key in keys[: bounds[stage]] + keys[bounds[stage + 1] :]:
        del model.layers[key]
    if stage > 0:
        model.tok_embeddings = model.pos_embeddings = None
    if stage < stages - 1:
        model.norm = model.output = None
    return model


def _pipeline(model: Transformer, spec: LayoutSpec, mesh: DeviceMesh, dp: DeviceMesh | None) -> Parallel:
    stage, stages = mesh.get_local_rank(), mesh.size()
    part = stage_of(model, stage, stages)
    if dp is not None:
        _shard_blocks(part, dp)
    # Imported here: 0.3 s of every rank's start otherwise, and most runs have no pipeline (a relaunch
    # waits for its ranks' imports).
    from torch.distributed import pipelining

    runner = pipelining.PipelineStage(part, stage, stages, torch.device("cpu"), group=mesh.get_group())
    micro_batches = spec.micro_batches or stages
    schedule = getattr(pipelining, SCHEDULES[spec.schedule])(runner, micro_batches, loss_fn=next_token_loss)
    replicas = 1 if dp is None else dp.size()
    index = 0 if dp is None else dp.get_local_rank()

    def run(tokens: torch.Tensor, train: bool) -> torch.Tensor | None:
        mine = _share(tokens, index, replicas)
        if mine.shape[0] % micro_batches:
            raise ValueError(f"a batch of {mine.shape[0]} does not split into {micro_batches} micro-batches")
        losses: list[torch.Tensor] = []
        go = schedule.step if train else schedule.eval  # eval: the same micro-batches, forward only
        if stage == 0:
            go(mine)
        elif stage == stages - 1:
            go(target=mine, losses=losses)
        else:
            go()
        return torch.stack(losses).mean() if losses else None

    return Parallel(part, lambda t: run(t, True), 1.0 / replicas, lambda t: run(t, False))


@layout("pp")
def pp(model: Transformer, spec: LayoutSpec) -> Parallel:
    return _pipeline(model, spec, init_device_mesh("cpu", (dist.get_world_size(),)), None)


@layout("pp_dp")
def pp_dp(model: Transformer, spec: LayoutSpec) -> Parallel:
    dp = dist.get_world_size() // spec.pp
    mesh = init_device_mesh("cpu", (spec.pp, dp), mesh_dim_names=("pp", "dp"))
    return _pipeline(model, spec, mesh["pp"], mesh["dp"])
