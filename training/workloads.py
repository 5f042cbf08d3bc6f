"""What each model kind brings to the one training loop (training/trainer.py): its model on this rank in
the configured (or planned) parallel strategy, a step's loss on this rank, its evaluation at checkpoints
and its export at the end. A kind is an entry of `KINDS`; a new one is an addition.

- `mlp`: a binary classifier (training/model.py, the flight-delay model) on the parquet training set
  (training/data.py), with DDP or FSDP (training/distributed.py); `auto` asks `planner.runtime_strategy`;
- `mlp_regressor`: the same network as a regressor (the temperature forecast), served in the label's
  units;
- `transformer`: the decoder-only transformer (training/transformer.py) on synthetic token sequences
  from the seed and the step, in any layout of training/layouts.py; `auto` takes the layout the
  planner's `plan` chooses for the model's shape, the gang's devices and interconnect, and the batch.

The heartbeats, preemption votes, checkpoint schedule, fencing, MLflow run and events are the loop's,
the same for every kind; the checkpoints hold the model and optimizer by parameter name whatever the
layout, so a run saved in one layout resumes in another. Every kind keeps the global batch of a step
fixed whatever the gang's size, each worker accumulating micro-batches where its share is larger
than `train.micro_batch_size` (training/batching.py): a run resized between checkpoints computes the
same steps.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training import batching, distributed, planner
from training.batching import BatchSplit
from training.config import Config, ConfigError, ModelConfig
from training.data import Dataset, StepSampler, feature_stats, read_parquet, split
from training.layouts import LAYOUT_FIELDS, LAYOUTS, SCHEDULES, LayoutSpec, degrees, from_plan, parallelize
from training.mlflow_tracking import Tracker
from training.model import MLPClassifier, Probability, Rescaled, count_parameters
from training.transformer import Transformer, TransformerSpec, synthetic_tokens


@dataclass(frozen=True)
class Pieces:
    """One step's micro-batch gradients on this rank, for an adaptive batch's noise (training/adaptive.py)."""

    sqr_sum: float  # the sum over this rank's micro-batches of each one's gradient's squared norm
    count: int  # this rank's micro-batches
    mean_sqr: float  # the squared norm of the step's gradient (their mean over every rank)
    compute_s: float  # this rank's seconds of forward and backward


class Workload(ABC):
    """One rank's part of a training run of one model kind, built as `kind(cfg, world)`: what the loop
    steps, checkpoints, evaluates and exports."""

    strategies: ClassVar[tuple[str, ...]]
    """What `parallel.strategy` may name besides `auto`."""

    model: nn.Module
    """This rank's part of the model: what the optimizer steps and the checkpoints hold (by name)."""
    n_parameters: int
    """The full model's."""
    strategy: str
    reason: str
    """Why this strategy: the config named it, or the planner's reasons."""
    split: BatchSplit
    """How each step's global batch splits over the gang's data-parallel workers."""
    adaptive: ClassVar[bool] = False
    """Whether the kind takes `train.adaptive_batch` (`rebatch`, `pieces`)."""
    pieces: Pieces | None = None
    """With an adaptive batch: the last step's micro-batch gradients."""

    def __init__(self, cfg: Config, world: distributed.World) -> None:
        self.cfg = cfg
        self.world = world

    @classmethod
    @abstractmethod
    def check(cls, cfg: Config) -> None:
        """The kind's own config rules (a ConfigError names the field)."""

    @abstractmethod
    def forward_backward(self, step: int) -> tuple[float, float]:
        """Step `step` (0-based) on this rank: forward and backward of each micro-batch of `split`,
        leaving the gradient of the step's mean loss, returning (loss x rows, rows), rows being the
        samples its loss stands for; the step's loss is the sum of the first over the ranks divided by
        the sum of the second."""

    def rebatch(self, global_batch: int, step: int, position: int) -> None:
        """Train at `global_batch` from step `step`, whose examples start at `position` of the stream
        (an adaptive batch: the kinds with `adaptive`)."""
        raise NotImplementedError(f"model.kind {self.cfg.model.kind} trains at a fixed global batch")

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Validation metrics for a checkpoint (a collective; rank 0's are recorded)."""

    @abstractmethod
    def export(self, tracker: Tracker) -> None:
        """Log the trained model to MLflow from rank 0 (a collective: the full weights are gathered)."""


KINDS: dict[str, type[Workload]] = {}


def kind(name: str) -> Callable[[type[Workload]], type[Workload]]:
    def register(cls: type[Workload]) -> type[Workload]:
        KINDS[name] = cls
        return cls

    return register


def check(cfg: Config) -> None:
    """The configured model kind's rules and its parallel strategy's (a ConfigError names the field)."""
    model, parallel = cfg.model, cfg.parallel
    if model.kind not in KINDS:
        raise ConfigError(f"model.kind: expected one of {', '.join(KINDS)}, got {model.kind!r}")
    workload = KINDS[model.kind]
    if parallel.strategy != "auto" and parallel.strategy not in workload.strategies:
        names = ", ".join(("auto", *workload.strategies))
        raise ConfigError(
            f"parallel.strategy: expected one of {names} for model.kind {model.kind}, "
            f"got {parallel.strategy!r}"
        )
    if cfg.train.adaptive_batch is not None:
        if not workload.adaptive:
            adaptive = ", ".join(k for k, w in KINDS.items() if w.adaptive)
            raise ConfigError(
                f"train.adaptive_batch: model.kind {model.kind} trains at a fixed global batch; "
                f"only {adaptive} take an adaptive one"
            )
        _check_adaptive_strategy(parallel.strategy)
    for name, takers in LAYOUT_FIELDS.items():
        if getattr(parallel, name) is not None and parallel.strategy not in takers:
            chosen = "auto (the planner chooses it)" if parallel.strategy == "auto" else parallel.strategy
            raise ConfigError(
                f"parallel.{name}: only strategy {' or '.join(takers)} takes it; the strategy is {chosen}"
            )
    workload.check(cfg)


def _check_adaptive_strategy(strategy: str) -> None:
    """An adaptive batch measures each worker's micro-batch gradients, which DDP leaves whole on each
    worker and FSDP shards."""
    if strategy == "fsdp":
        raise ConfigError(
            "parallel.strategy: train.adaptive_batch measures each worker's micro-batch gradients, which "
            "fsdp shards: use ddp"
        )


def build(cfg: Config, world: distributed.World) -> Workload:
    return KINDS[cfg.model.kind](cfg, world)


def device_memory_gb(cfg: Config, device: torch.device) -> float:
    """Memory per device for `strategy: auto`: the config's, else the GPU's, else 16 GB (CPU ranks)."""
    if cfg.parallel.gpu_memory_gb is not None:
        return cfg.parallel.gpu_memory_gb
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return 16.0


def gather_full_state(model: nn.Module, world: distributed.World) -> dict[str, torch.Tensor]:
    """The full model's weights and buffers on rank 0 (empty elsewhere), from any layout: each rank's
    unsharded (a collective over the meshes of sharded tensors), then merged by name, each sent by the
    first rank that holds it (a pipeline's stages hold different ones, replicas the same)."""
    mine: dict[str, Any] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    held: list[Any] = [None] * world.world_size
    dist.all_gather_object(held, sorted(mine), group=world.checkpoint_group)
    earlier: set[str] = set().union(*held[: world.rank])
    send = {name: tensor.detach().cpu() for name, tensor in mine.items() if name not in earlier}
    parts: list[Any] | None = [None] * world.world_size if world.is_leader else None
    dist.gather_object(send, parts, dst=0, group=world.checkpoint_group)
    return {name: tensor for part in parts or [] for name, tensor in part.items()}


class TabularMLP(Workload):
    """An MLP on the parquet training set: `StepSampler`'s global batch of each step, each rank its
    slice, in micro-batches; a subclass says what its label is, its loss, its validation metrics and
    its served form."""

    strategies = distributed.STRATEGIES
    adaptive = True
    binary: ClassVar[bool]
    """Its labels are 0/1."""

    @classmethod
    def check(cls, cfg: Config) -> None:
        if cfg.data.path is None:
            kind = cfg.model.kind
            raise ConfigError(
                f"data.path: missing required field: model.kind {kind} trains on a parquet training set"
            )

    def __init__(self, cfg: Config, world: distributed.World) -> None:
        super().__init__(cfg, world)
        self.data = split(read_parquet(cfg.data, self.binary), cfg.data.val_fraction, cfg.seed)
        self.sampler = StepSampler(len(self.data.train), cfg.train.global_batch_size, cfg.seed)
        self.split = batching.split(cfg.train.global_batch_size, world.world_size, cfg.train.micro_batch_size)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        mean, std = feature_stats(self.data.train)
        base = MLPClassifier(self.n_features, cfg.model.hidden, cfg.model.dropout, mean, std)
        self.n_parameters = count_parameters(base)
        if cfg.parallel.strategy == "auto":
            memory = device_memory_gb(cfg, world.device)
            self.strategy, self.reason = planner.runtime_strategy(self.n_parameters, memory, world.world_size)
        else:
            self.strategy, self.reason = cfg.parallel.strategy, "set by config"
        if cfg.train.adaptive_batch is not None:
            _check_adaptive_strategy(self.strategy)
        self.model = distributed.wrap(base, self.strategy, world)

    @property
    def n_features(self) -> int:
        return int(self.data.train.features.shape[1])

    @abstractmethod
    def loss(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss of the model's outputs against the labels."""

    @abstractmethod
    def served(self, network: nn.Module) -> nn.Module:
        """The trained network as it is served (raw features in)."""

    def rebatch(self, global_batch: int, step: int, position: int) -> None:
        self.sampler = StepSampler(len(self.data.train), global_batch, self.cfg.seed, step, position)
        self.split = batching.split(global_batch, self.world.world_size, self.cfg.train.micro_batch_size)

    def forward_backward(self, step: int) -> tuple[float, float]:
        """This rank's share of the step's global batch, in micro-batches of `split.local_batch`. With
        an adaptive batch every micro-batch stays local (each one's gradient is measured: `pieces`)
        and the gradients are averaged over the ranks after the last."""
        share = self.sampler.local_batch(step, self.world.rank, self.world.world_size)
        pieces = share.split(self.split.local_batch)
        measure = self.cfg.train.adaptive_batch is not None
        total, sqr_sum = 0.0, 0.0
        began = time.perf_counter()
        for i, idx in enumerate(pieces):
            x = self.data.train.features[idx].to(self.world.device)
            y = self.data.train.labels[idx].to(self.world.device)
            before = distributed.flat_gradient(self.model) if measure else None
            with distributed.micro_batch(self.model, last=not measure and i == len(pieces) - 1):
                loss = self.loss(self.model(x), y)
                loss.backward()
            if before is not None:
                sqr_sum += float((distributed.flat_gradient(self.model) - before).square().sum())
            total += loss.item() * len(idx)
        compute_s = time.perf_counter() - began
        if measure:
            distributed.average_gradients(self.model)
        if len(pieces) > 1:
            distributed.scale_gradients(self.model, 1.0 / len(pieces))
        if measure:
            mean_sqr = float(distributed.flat_gradient(self.model).square().sum())
            self.pieces = Pieces(sqr_sum, len(pieces), mean_sqr, compute_s)
        return total, float(len(share))

    def export(self, tracker: Tracker) -> None:
        full = gather_full_state(self.model, self.world)
        if not self.world.is_leader:
            return
        plain = MLPClassifier(self.n_features, self.cfg.model.hidden, self.cfg.model.dropout)
        plain.load_state_dict(full)
        tracker.log_model(self.served(plain).eval(), self.data.train.features[:5])


@kind("mlp")
class Classifier(TabularMLP):
    """The MLP as a binary classifier: a logit per row, binary cross-entropy; validation loss and
    accuracy; served as the probability of the positive class."""

    binary = True

    def loss(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(output, labels)

    def evaluate(self) -> dict[str, float]:
        return evaluate_classifier(self.model, self.data.val, self.world.device)

    def served(self, network: nn.Module) -> nn.Module:
        return Probability(network)


@kind("mlp_regressor")
class Regressor(TabularMLP):
    """The MLP as a regressor: it learns the label standardized by the training rows' mean and
    deviation (mean squared error); validation loss (in those units) and mean absolute error (in the
    label's); served in the label's units."""

    binary = False

    def __init__(self, cfg: Config, world: distributed.World) -> None:
        super().__init__(cfg, world)
        labels = self.data.train.labels
        self.label_mean = float(labels.mean())
        self.label_std = float(labels.std(unbiased=False)) or 1.0

    def loss(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, (labels - self.label_mean) / self.label_std)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Every rank runs it (an FSDP forward is collective)."""
        val = self.data.val
        if len(val) == 0:
            return {}
        was_training = self.model.training
        self.model.eval()
        output = torch.cat(
            [self.model(c.to(self.world.device)).float().cpu() for c in torch.split(val.features, 65536)]
        )
        self.model.train(was_training)
        predicted = output * self.label_std + self.label_mean
        return {
            "val_loss": self.loss(output, val.labels).item(),
            "val_mae": (predicted - val.labels).abs().mean().item(),
        }

    def served(self, network: nn.Module) -> nn.Module:
        return Rescaled(network, self.label_mean, self.label_std)


@torch.no_grad()
def evaluate_classifier(model: nn.Module, data: Dataset, device: torch.device) -> dict[str, float]:
    """Loss and accuracy on the validation set; every rank runs it (FSDP forward is collective)."""
    if len(data) == 0:
        return {}
    was_training = model.training
    model.eval()
    chunks = torch.split(data.features, 65536)
    logits = torch.cat([model(chunk.to(device)).float().cpu() for chunk in chunks])
    model.train(was_training)
    loss = F.binary_cross_entropy_with_logits(logits, data.labels).item()
    accuracy = ((logits > 0).float() == data.labels).float().mean().item()
    return {"val_loss": loss, "val_accuracy": accuracy}


def step_tokens(spec: TransformerSpec, batch: int, seed: int, step: int) -> torch.Tensor:
    """Step `step`'s global batch (0-based), from the seed and the step alone: a resumed run, on any
    number of ranks in any layout, sees the same batches. Step -1's is the held-out batch."""
    return synthetic_tokens(spec, batch, seed * 1_000_003 + step + 1)


def _check_split(model: ModelConfig, tp: int, pp: int, where: str) -> None:
    """Tensor parallelism over `tp` ranks splits the heads, the vocabulary and the sequence; `pp`
    pipeline stages take whole layers."""
    for name in ("heads", "vocab", "seq_len"):
        size = getattr(model, name)
        if size % tp:
            raise ConfigError(
                f"{where}: tensor parallelism over {tp} ranks splits model.{name} ({size}), "
                "which it does not divide"
            )
    if pp > model.layers:
        raise ConfigError(
            f"{where}: {pp} pipeline stages need as many layers; model.layers is {model.layers}"
        )


def check_layout(
    spec: LayoutSpec,
    model: ModelConfig,
    world_size: int,
    global_batch: int,
    micro_batch_size: int | None = None,
) -> BatchSplit:
    """What a layout's split of the gang's ranks must keep (a ConfigError names the field); returns
    how each step's global batch splits over its data-parallel ranks. A pipeline accumulates over its
    own micro-batches (`parallel.micro_batches`) and takes no `train.micro_batch_size`."""
    where = f"parallel.strategy {spec.name} on {world_size} ranks"
    dp, tp, pp = degrees(spec, world_size)
    if dp * tp * pp != world_size:
        field = "parallel.tp" if tp > 1 else "parallel.pp"
        raise ConfigError(f"{field}: {tp * pp} does not divide the {world_size} ranks ({where})")
    _check_split(model, tp, pp, where)
    if pp > 1 and micro_batch_size is not None:
        raise ConfigError(
            "train.micro_batch_size: a pipeline accumulates over its own micro-batches "
            f"(parallel.micro_batches); leave it null ({where})"
        )
    try:
        split = batching.split(global_batch, dp, micro_batch_size)
    except ConfigError as exc:
        raise ConfigError(f"{exc} ({where})") from None
    if pp > 1:
        micro = spec.micro_batches or pp
        if micro < pp or (global_batch // dp) % micro:
            raise ConfigError(
                f"parallel.micro_batches: {micro} micro-batches must be at least the {pp} stages and divide "
                f"each replica's {global_batch // dp} sequences ({where})"
            )
    return split


def plan_layout(
    cfg: Config, n_parameters: int, world_size: int, memory_gb: float, env: Mapping[str, str] = os.environ
) -> tuple[LayoutSpec, str]:
    """`strategy: auto` for the transformer: the layout the planner (`planner.plan`, as `gpuyard plan`
    makes it) chooses for the model's shape, the gang's devices (`parallel.gpus_per_node`, else
    LOCAL_WORLD_SIZE, else all on one node), their memory and links, AdamW in fp32 (as the runtime
    trains) and the global batch in one micro-batch per rank (as the data-parallel layouts take it; a
    pipeline then gets one per stage). Returns the layout (`layouts.from_plan`) and the plan's reasons."""
    m, p, batch = cfg.model, cfg.parallel, cfg.train.global_batch_size
    per_node = p.gpus_per_node or int(env.get("LOCAL_WORLD_SIZE", world_size))
    if world_size % per_node:
        raise ConfigError(f"parallel.gpus_per_node: {per_node} does not divide the gang's {world_size} ranks")
    if batch % world_size:
        raise ConfigError(
            f"train.global_batch_size: strategy auto plans one micro-batch per rank; {batch} does not split "
            f"over {world_size} ranks"
        )
    shape = planner.ModelShape(float(n_parameters), m.layers, m.width, m.heads, m.vocab, m.seq_len)
    train = planner.Training(batch // world_size, batch, "adamw", "fp32", flash_attention=True)
    links: dict[str, float] = {}  # unset: the planner's defaults
    if p.intra_node_gbps is not None:
        links["intra_node_gbps"] = p.intra_node_gbps
    if p.inter_node_gbps is not None:
        links["inter_node_gbps"] = p.inter_node_gbps
    fleet = planner.Fleet(memory_gb, per_node, world_size // per_node, **links)
    try:
        result = planner.plan(shape, train, fleet)
    except planner.PlanError as exc:
        raise ConfigError(f"parallel.strategy auto: {exc}") from exc
    s = result.strategy
    chosen = f"dp={s['dp']} fsdp={s['fsdp']} tp={s['tp']} pp={s['pp']} micro-batches={result.microbatches}"
    return from_plan(result.layout, p.schedule), f"planner: {chosen}: " + "; ".join(result.reasons)


@kind("transformer")
class LanguageModel(Workload):
    """The transformer on synthetic token sequences (`step_tokens`), in a layout of `LAYOUTS`: each step
    the global batch of (seed, step), split as the layout splits it; validation loss on the held-out
    batch; exported as the full model (tokens in, next-token logits out)."""

    strategies = tuple(LAYOUTS)

    @classmethod
    def check(cls, cfg: Config) -> None:
        m, p = cfg.model, cfg.parallel
        for name in ("vocab", "width", "heads", "layers", "seq_len"):
            if getattr(m, name) < 1:
                raise ConfigError(f"model.{name}: expected >= 1, got {getattr(m, name)}")
        if m.width % m.heads:
            raise ConfigError(f"model.width: {m.width} is not a multiple of model.heads {m.heads}")
        if cfg.data.path is not None:
            raise ConfigError(
                "data.path: model.kind transformer trains on synthetic token sequences and reads no data"
            )
        if p.schedule not in SCHEDULES:
            raise ConfigError(
                f"parallel.schedule: expected one of {', '.join(SCHEDULES)}, got {p.schedule!r}"
            )
        if p.strategy == "fsdp_tp" and p.tp is None:
            raise ConfigError("parallel.tp: strategy fsdp_tp needs the size of its tensor-parallel groups")
        if p.strategy == "pp_dp" and p.pp is None:
            raise ConfigError("parallel.pp: strategy pp_dp needs its number of pipeline stages")
        _check_split(m, p.tp or 1, 1, "parallel.tp")
        _check_split(m, 1, p.pp or 1, "parallel.pp")

    def __init__(self, cfg: Config, world: distributed.World) -> None:
        super().__init__(cfg, world)
        if world.device.type != "cpu":
            raise ConfigError(
                f"parallel.backend: the transformer's layouts run on CPU ranks over gloo, this rank's "
                f"device is {world.device}; set it to gloo"
            )
        m = cfg.model
        self.spec = TransformerSpec(m.vocab, m.width, m.heads, m.layers, m.seq_len, dropout=m.dropout)
        self.batch = cfg.train.global_batch_size
        self.held_out = step_tokens(self.spec, self.batch, cfg.seed, -1)
        torch.manual_seed(cfg.seed)  # the same full model on every rank
        full = Transformer(self.spec)
        self.n_parameters = count_parameters(full)
        p = cfg.parallel
        if p.strategy == "auto":
            memory = device_memory_gb(cfg, world.device)
            self.layout, self.reason = plan_layout(cfg, self.n_parameters, world.world_size, memory)
        else:
            tp, pp = p.tp or 1, p.pp or 1
            self.layout = LayoutSpec(p.strategy, tp, pp, p.micro_batches, p.schedule)
            self.reason = "set by config"
        self.strategy = self.layout.name
        self.split = check_layout(self.layout, m, world.world_size, self.batch, cfg.train.micro_batch_size)
        self.parallel = parallelize(full, self.layout)
        self.model = self.parallel.model

    def forward_backward(self, step: int) -> tuple[float, float]:
        """The step's global batch in `split.accum_steps` global micro-batches, each split by the
        layout over its data-parallel ranks."""
        tokens = step_tokens(self.spec, self.batch, self.cfg.seed, step)
        pieces = tokens.chunk(self.split.accum_steps)
        losses = []
        for i, chunk in enumerate(pieces):
            with distributed.micro_batch(self.model, last=i == len(pieces) - 1):
                loss = self.parallel.forward_backward(chunk)
            if loss is not None:  # a pipeline stage before the last computes none
                losses.append(float(loss.detach()))
        if len(pieces) > 1:
            distributed.scale_gradients(self.model, 1.0 / len(pieces))
        if not losses:
            return 0.0, 0.0
        rows = self.parallel.weight * self.batch
        return sum(losses) / len(losses) * rows, rows

    def evaluate(self) -> dict[str, float]:
        return {"val_loss": self.parallel.evaluate(self.held_out)}

    def export(self, tracker: Tracker) -> None:
        full = gather_full_state(self.model, self.world)
        if not self.world.is_leader:
            return
        plain = Transformer(self.spec)
        plain.load_state_dict(full)
        tracker.log_model(plain.eval(), self.held_out[:2])
