"""Parallelism planner: which mix of data parallel (DDP or FSDP), tensor parallel and pipeline parallel to use
for a model on a given fleet, with a per-GPU memory breakdown and the reasons in words.

Memory model (bytes per GPU), for a GPT-style transformer:
- model states (ZeRO paper, Rajbhandari et al. 2020): weights, gradients and optimizer state per parameter,
  divided by tensor x pipeline parallel degrees, and by the data-parallel degree under FSDP (ZeRO-3);
- activations (Korthikanti et al. 2022), per layer and micro-batch: s*b*h*(34 + 5*a*s/h) bytes in 16-bit,
  divided by tp with sequence parallelism; the attention-score term vanishes with flash attention; full
  activation checkpointing keeps only each layer's input (2*s*b*h) plus one layer being recomputed; with
  1F1B pipelining the first stage holds pp micro-batches of its L/pp layers;
- FSDP's gathered copy of the largest unit (two in flight with prefetch), logits, and a fixed runtime reserve.

The choice: among the layouts that fit, the one with the lowest estimated step time (compute, inflated by
recomputation and pipeline bubbles, plus communication that is not overlapped).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

Optimizer = Literal["adamw", "adam", "sgd", "adafactor"]
Precision = Literal["bf16", "fp16", "fp32"]
GB = 1e9


GPU_TYPES: dict[str, tuple[float, float]] = {
    # name: (memory GB, dense 16-bit TFLOPS)
    "h200": (141.0, 989.0),
    "h100-80gb": (80.0, 989.0),
    "a100-80gb": (80.0, 312.0),
    "a100-40gb": (40.0, 312.0),
    "l40s": (48.0, 362.0),
    "a10g": (24.0, 125.0),
}


class PlanError(ValueError):
    """The request is impossible (does not fit even at the largest sharding) or inconsistent."""


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    assumed: bool = False
    """True when the shape was inferred from the parameter count alone."""


@dataclass(frozen=True)
class Fleet:
    gpu_memory_gb: float
    gpus_per_node: int = 8
    nodes: int = 1
    intra_node_gbps: float = 450.0
    """GB/s per GPU inside a node (NVLink 4: ~450 GB/s each way)."""
    inter_node_gbps: float = 50.0
    """GB/s per GPU between nodes (400 Gb/s InfiniBand: 50 GB/s; 100 Gb/s Ethernet: 12.5)."""
    gpu_tflops: float = 989.0
    """Dense 16-bit peak (H100 SXM: 989)."""
    mfu: float = 0.4
    reserve_gb: float = 2.0
    """CUDA context, allocator fragmentation, communication buffers."""

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Training:
    micro_batch: int = 1
    global_batch: int | None = None
    """Sequences per optimizer step; default: one micro-batch per GPU (the same for every layout)."""
    optimizer: Optimizer = "adamw"
    precision: Precision = "bf16"
    flash_attention: bool = True


@dataclass(frozen=True)
class Layout:
    dp: int
    fsdp: bool
    tp: int
    pp: int
    activation_checkpointing: bool
    microbatches: int

    @property
    def strategy(self) -> dict[str, int | bool]:
        return {"dp": self.dp, "fsdp": self.fsdp, "tp": self.tp, "pp": self.pp}


@dataclass(frozen=True)
class Plan:
    strategy: dict[str, int | bool]
    activation_checkpointing: bool
    microbatches: int
    bubble_fraction: float
    per_gpu_memory_gb: dict[str, float]
    step_time_s: float
    model: dict[str, float | int | bool]
    reasons: list[str] = field(default_factory=list)

    @property
    def layout(self) -> Layout:
        s = self.strategy
        return Layout(
            int(s["dp"]),
            bool(s["fsdp"]),
            int(s["tp"]),
            int(s["pp"]),
            self.activation_checkpointing,
            self.microbatches,
        )

    def to_json(self) -> dict[str, object]:
        return asdict(self)


# --- model states -----------------------------------------------------------------------------------------


def bytes_per_param(optimizer: Optimizer, precision: Precision) -> dict[str, float]:
    """Weights, gradients and optimizer state per parameter. Mixed precision keeps 16-bit weights and
    gradients plus an fp32 master copy in the optimizer state (ZeRO's 2 + 2 + 12 for Adam)."""
    mixed = precision != "fp32"
    weight = 2.0 if mixed else 4.0
    grad = 2.0 if mixed else 4.0
    moments = {"adamw": 8.0, "adam": 8.0, "sgd": 4.0, "adafactor": 0.1}[optimizer]
    master = 4.0 if mixed else 0.0
    return {"parameters": weight, "gradients": grad, "optimizer_state": moments + master}


def model_state_bytes(
    params: float, optimizer: Optimizer, precision: Precision, shards: int = 1, zero_stage: int = 0
) -> dict[str, float]:
    """Per-GPU bytes of weights, gradients and optimizer state for ZeRO stage 0-3 over `shards` ranks
    (stage 3 = FSDP full sharding)."""
    per = bytes_per_param(optimizer, precision)
    return {
        "parameters": params * per["parameters"] / (shards if zero_stage >= 3 else 1),
        "gradients": params * per["gradients"] / (shards if zero_stage >= 2 else 1),
        "optimizer_state": params * per["optimizer_state"] / (shards if zero_stage >= 1 else 1),
    }


# --- shapes and activations ---------------------------------------------------------------------------------


def infer_shape(params: float, seq_len: int, vocab: int = 32000) -> ModelShape:
    """A GPT-like shape for a parameter count: 12*L*h^2 + 2*V*h parameters with L ~ h/128 (Llama-style
    aspect ratio), head size 128, hidden a multiple of 1024 (so 8-way tensor parallel divides the heads)."""
    h = (params * 128 / 12) ** (1 / 3)
    hidden = max(128, round(h / 1024) * 1024) if h > 1024 else max(128, round(h / 128) * 128)
    layers = max(1, round((params - 2 * vocab * hidden) / (12 * hidden * hidden)))
    return ModelShape(params, layers, hidden, hidden // 128, vocab, seq_len, assumed=True)


def shape_params(layers: int, hidden: int, vocab: int) -> float:
    return 12.0 * layers * hidden * hidden + 2.0 * vocab * hidden


def activation_bytes_per_layer(
    shape: ModelShape, micro_batch: int, tp: int, flash_attention: bool, precision: Precision
) -> float:
    """Korthikanti et al. 2022, eq. with sequence parallelism: s*b*h*(34 + 5*a*s/h)/tp bytes in 16-bit."""
    s, b, h, a = shape.seq_len, micro_batch, shape.hidden, shape.heads
    per_token = 34.0 + (0.0 if flash_attention else 5.0 * a * s / h)
    scale = 2.0 if precision == "fp32" else 1.0
    return s * b * h * per_token / tp * scale


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- evaluation of one layout -------------------------------------------------------------------------------


def memory(shape: ModelShape, train: Training, fleet: Fleet, lay: Layout) -> dict[str, float]:
    """Per-GPU memory breakdown in GB for one layout."""
    local_params = shape.params / (lay.tp * lay.pp)
    states = model_state_bytes(
        local_params, train.optimizer, train.precision, shards=lay.dp, zero_stage=3 if lay.fsdp else 0
    )
    layers_per_stage = math.ceil(shape.layers / lay.pp)
    per_layer = activation_bytes_per_layer(
        shape, train.micro_batch, lay.tp, train.flash_attention, train.precision
    )
    in_flight = min(lay.pp, lay.microbatches)
    if lay.activation_checkpointing:
        width = 4.0 if train.precision == "fp32" else 2.0
        kept = shape.seq_len * train.micro_batch * shape.hidden * width / lay.tp
        activations = in_flight * layers_per_stage * kept + per_layer
    else:
        activations = in_flight * layers_per_stage * per_layer
    logits = shape.seq_len * train.micro_batch * shape.vocab * 4.0 / lay.tp
    out = {k: v / GB for k, v in states.items()}
    out["activations"] = activations / GB
    out["logits"] = logits / GB
    weight_bytes = bytes_per_param(train.optimizer, train.precision)["parameters"]
    layer_params = 12.0 * shape.hidden * shape.hidden / lay.tp
    out["fsdp_gathered"] = (2 * layer_params * weight_bytes / GB) if lay.fsdp and lay.dp > 1 else 0.0
    out["reserve"] = fleet.reserve_gb
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}


def exchange_bytes(shape: ModelShape, train: Training, lay: Layout) -> dict[str, float]:
    """Bytes one GPU sends per optimizer step (ring collectives: it receives as much), by kind:
    - `tp`: 4 all-reduces of a micro-batch's activations (s*b*h) per layer of its stage, 2*(tp-1)/tp of
      them each, for every micro-batch of the step;
    - `dp`: the data-parallel exchange of its shard of the weights (params / (tp*pp)), (dp-1)/dp of it
      per pass: DDP one gradient all-reduce (2 passes), FSDP two all-gathers per micro-batch and one
      reduce-scatter (2m + 1 passes);
    - `pp`: a stage in the middle of the pipeline sends each micro-batch's activations (s*b*h) to the
      next stage and their gradients back to the previous one, split over its tp ranks.
    The step-time model charges all three (`step_time`)."""
    width = 4.0 if train.precision == "fp32" else 2.0
    activations = shape.seq_len * train.micro_batch * shape.hidden * width
    tp = 0.0
    if lay.tp > 1:
        per_layer = 4 * activations * 2 * (lay.tp - 1) / lay.tp
        tp = per_layer * math.ceil(shape.layers / lay.pp) * lay.microbatches
    dp = 0.0
    if lay.dp > 1:
        dp = (shape.params / (lay.tp * lay.pp)) * width * (lay.dp - 1) / lay.dp
        dp *= (2 * lay.microbatches + 1) if lay.fsdp else 2
    pp = 2 * activations / lay.tp * lay.microbatches if lay.pp > 1 else 0.0
    return {"tp": tp, "dp": dp, "pp": pp}


def crosses_nodes(fleet: Fleet, lay: Layout) -> dict[str, bool]:
    """Which exchanges of `exchange_bytes` leave a node, ranks ordered tp, then dp, then pp: TP never
    (tp divides a node's GPUs); DP when its group (dp x tp GPUs) is larger than a node; PP when the
    whole pipeline (tp x dp x pp GPUs) is, so that at least one stage boundary lies between nodes."""
    return {
        "tp": False,
        "dp": lay.dp > 1 and lay.dp * lay.tp > fleet.gpus_per_node,
        "pp": lay.pp > 1 and lay.tp * lay.dp * lay.pp > fleet.gpus_per_node,
    }


def checkpoint_bytes(params: float, optimizer: Optimizer, precision: Precision) -> float:
    """Bytes of one full checkpoint: the weights and the optimizer state (with mixed precision its fp32
    master copy), as `bytes_per_param` counts them; gradients are not saved."""
    per = bytes_per_param(optimizer, precision)
    return params * (per["parameters"] + per["optimizer_state"])


def exposed_exchange_s(exchange_s: float, compute_s: float) -> float:
    """The part of a data-parallel exchange a step waits for: at most half of it overlaps the backward
    pass (two thirds of the compute: 4 of the 6 flops per parameter and token), and no more than that
    pass lasts. On a slow link (another site, `benchmarks/wan_ddp.py`) the backward pass ends long
    before the exchange does, and nearly all of it shows."""
    return exchange_s - min(0.5 * exchange_s, 2 / 3 * compute_s)


def step_time(shape: ModelShape, train: Training, fleet: Fleet, lay: Layout, global_batch: int) -> float:
    """Estimated seconds per optimizer step: compute (x4/3 with recomputation, / (1 - bubble)) plus
    communication that does not overlap (`exchange_bytes`): the TP all-reduces on the links inside a
    node, and the data-parallel exchange less what overlaps the backward pass (`exposed_exchange_s`)
    on the links inside a node, or between nodes when its group spans several (`crosses_nodes`), and
    the pipeline's sends on the link of its stage boundaries."""
    tokens = global_batch * shape.seq_len
    flops = 6.0 * shape.params * tokens * (4 / 3 if lay.activation_checkpointing else 1.0)
    compute = flops / (fleet.gpus * fleet.gpu_tflops * 1e12 * fleet.mfu)
    bubble = (lay.pp - 1) / (lay.microbatches + lay.pp - 1)
    compute /= 1.0 - bubble
    sent = exchange_bytes(shape, train, lay)
    tp_comm = sent["tp"] / (fleet.intra_node_gbps * GB)
    bw = fleet.inter_node_gbps if crosses_nodes(fleet, lay)["dp"] else fleet.intra_node_gbps
    dp_comm = exposed_exchange_s(sent["dp"] / (bw * GB), compute)
    # The pipeline's sends wait on the stage boundary's link: small beside the other exchanges on a
    # large model, but what keeps a small one off a pipeline it gains nothing from.
    pp_bw = fleet.inter_node_gbps if crosses_nodes(fleet, lay)["pp"] else fleet.intra_node_gbps
    pp_comm = sent["pp"] / (pp_bw * GB)
    return compute + tp_comm + dp_comm + pp_comm


def candidates(shape: ModelShape, train: Training, fleet: Fleet) -> list[Layout]:
    out = []
    for tp in _divisors(fleet.gpus_per_node):
        if shape.heads % tp:
            continue
        for pp in _divisors(fleet.gpus // tp):
            if pp > shape.layers:
                continue
            dp = fleet.gpus // (tp * pp)
            per_step = train.global_batch or fleet.gpus * train.micro_batch
            if per_step % (dp * train.micro_batch):
                continue
            microbatches = per_step // (dp * train.micro_batch)
            for fsdp in (False, True):
                if fsdp and dp == 1:
                    continue
                for ckpt in (False, True):
                    out.append(Layout(dp, fsdp, tp, pp, ckpt, microbatches))
    return out


def plan(shape: ModelShape, train: Training, fleet: Fleet) -> Plan:
    """Recommend a layout, or raise PlanError saying why none fits."""
    if fleet.gpus < 1 or fleet.gpu_memory_gb <= 0:
        raise PlanError("the fleet needs at least one GPU with some memory")
    if train.global_batch is not None and train.global_batch % train.micro_batch:
        raise PlanError(
            f"global batch {train.global_batch} is not a multiple of micro-batch {train.micro_batch}"
        )
    options = candidates(shape, train, fleet)
    if not options:
        raise PlanError(
            f"no layout divides global batch {train.global_batch} into micro-batches of {train.micro_batch} "
            f"over {fleet.gpus} GPUs with heads={shape.heads}"
        )
    scored = []
    for lay in options:
        mem = memory(shape, train, fleet, lay)
        batch = lay.microbatches * lay.dp * train.micro_batch
        scored.append((lay, mem, step_time(shape, train, fleet, lay, batch)))
    fitting = [x for x in scored if x[1]["total"] <= fleet.gpu_memory_gb]
    if not fitting:
        lay, mem, _ = min(scored, key=lambda x: x[1]["total"])
        raise PlanError(
            f"does not fit: the largest sharding (dp={lay.dp}, fsdp={lay.fsdp}, tp={lay.tp}, pp={lay.pp}, "
            f"activation checkpointing={lay.activation_checkpointing}) still needs {mem['total']:.1f} GB per "
            f"GPU, and a GPU has {fleet.gpu_memory_gb:g} GB; add GPUs, use bigger GPUs, or shrink the "
            f"micro-batch or sequence length"
        )
    # Prefer the fastest; among near-ties (within 2%), the simplest layout.
    best_time = min(t for _, _, t in fitting)
    near = [x for x in fitting if x[2] <= best_time * 1.02]
    lay, mem, t = min(near, key=lambda x: (x[0].pp, x[0].tp, x[0].fsdp, x[0].activation_checkpointing))
    bubble = (lay.pp - 1) / (lay.microbatches + lay.pp - 1)
    return Plan(
        lay.strategy,
        lay.activation_checkpointing,
        lay.microbatches,
        round(bubble, 4),
        mem,
        round(t, 4),
        {
            "params": shape.params,
            "layers": shape.layers,
            "hidden": shape.hidden,
            "heads": shape.heads,
            "vocab": shape.vocab,
            "seq_len": shape.seq_len,
            "shape_assumed": shape.assumed,
        },
        explain(shape, train, fleet, lay, mem, scored),
    )


def explain(
    shape: ModelShape,
    train: Training,
    fleet: Fleet,
    lay: Layout,
    mem: dict[str, float],
    scored: list[tuple[Layout, dict[str, float], float]],
) -> list[str]:
    reasons = []
    if shape.assumed:
        reasons.append(
            f"shape assumed from {shape.params:.3g} parameters: {shape.layers} layers, hidden "
            f"{shape.hidden}, {shape.heads} heads (pass --layers/--hidden/--heads to set it)"
        )
    full = sum(model_state_bytes(shape.params, train.optimizer, train.precision).values()) / GB
    per = sum(bytes_per_param(train.optimizer, train.precision).values())
    fits_whole = full + fleet.reserve_gb <= fleet.gpu_memory_gb
    reasons.append(
        f"weights, gradients and {train.optimizer} state take {per:g} bytes/parameter = "
        f"{full:.1f} GB unsharded; a GPU has {fleet.gpu_memory_gb:g} GB"
    )
    if not lay.fsdp and lay.tp == 1 and lay.pp == 1:
        reasons.append("DDP: the whole model state fits on each GPU: replicate it, all-reduce gradients only")
    if lay.fsdp:
        why = "needed: they do not fit one GPU" if not fits_whole else "cheaper than replicas here"
        reasons.append(
            f"FSDP over {lay.dp} data-parallel ranks shards weights, gradients and optimizer state ({why})"
        )
    if lay.tp > 1:
        reasons.append(
            f"tensor parallel {lay.tp} inside a node (fast {fleet.intra_node_gbps:g} GB/s links) "
            f"splits each layer's matrices and activations {lay.tp} ways; it never crosses nodes"
        )
    if lay.pp > 1:
        bubble = (lay.pp - 1) / (lay.microbatches + lay.pp - 1)
        reasons.append(
            f"pipeline parallel {lay.pp} splits the {shape.layers} layers into stages; "
            f"{lay.microbatches} micro-batches per step leave a {bubble:.1%} bubble"
        )
    no_ckpt = [x for x in scored if x[0].strategy == lay.strategy and not x[0].activation_checkpointing]
    if lay.activation_checkpointing:
        reasons.append(
            "activation checkpointing on: without it activations do not fit "
            f"({no_ckpt[0][1]['total']:.1f} GB needed), recomputation costs ~33% more compute"
            if no_ckpt
            else "activation checkpointing on"
        )
    else:
        reasons.append(
            f"activation checkpointing off: activations ({mem['activations']:.1f} GB) fit, "
            "so no recomputation is spent"
        )
    reasons.append(
        f"estimated {mem['total']:.1f} of {fleet.gpu_memory_gb:g} GB per GPU; chosen as the "
        "fastest fitting layout by the step-time model"
    )
    return reasons


def runtime_strategy(
    n_params: int,
    gpu_memory_gb: float,
    world_size: int,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
) -> tuple[str, str]:
    """DDP or FSDP for the training runtime's own (small, non-transformer) models: FSDP when the replicated
    model state would take more than 60% of a device, which leaves room for activations."""
    full = sum(model_state_bytes(n_params, optimizer, precision).values()) / GB
    if world_size > 1 and full > 0.6 * gpu_memory_gb:
        return "fsdp", f"model state {full:.2f} GB > 60% of {gpu_memory_gb:g} GB: shard it"
    return "ddp", f"model state {full:.2f} GB fits in {gpu_memory_gb:g} GB per device: replicate it"
