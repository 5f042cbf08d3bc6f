"""What the network must carry for one training run, and what a checkpoint costs to move between sites,
from the parallelism planner's own formulas (training/planner.py; nothing is measured here).

Per step, for a 7B model on one node of 8 GPUs and a 70B model on 8 nodes of 8 (shapes assumed from
the parameter count as `gpuyard plan --params` assumes them, sequences of 4096 tokens, one per GPU per
step, mixed-precision AdamW, 80 GB GPUs): the bytes each GPU sends (`planner.exchange_bytes`) under DDP,
FSDP, tensor parallel (TP) and pipeline parallel (PP), and the planner's own choice; which of them
leave a node (`planner.crosses_nodes`); the memory per GPU (`planner.memory`) and whether it fits; the
modelled compute time of a step (`planner.step_time` with unbounded links); and how long the bytes
take on their links at line rate, none of it overlapped: inside a node at the planner's 450 GB/s per
GPU, and what crosses nodes at 400 Gb/s (InfiniBand, the planner's default), 100 Gb/s and 10 Gb/s (a
link between sites).

Then each model size's checkpoint (`planner.checkpoint_bytes`: weights and optimizer state, no
gradients) with mixed precision (the planner's default) and in fp32 (the training runtime's own
models), its transfer time at 1, 10 and 100 Gb/s at line rate, and its egress cost at two ASSUMED
prices per GB: AWS's list prices for data transfer out of EC2 to the internet (first 10 TB a month,
US regions, $0.09/GB) and between AWS regions ($0.02/GB). They are assumptions, not measurements: set
`--egress-usd-per-gb` to your provider's price.

    .venv/bin/python benchmarks/network_budget.py [--seq-len 4096] [--egress-usd-per-gb 0.09]

Last line: RESULT ddp_7b_gb=.. fsdp_7b_gb=.. tp_7b_gb=.. pp_7b_gb=.. ddp_70b_gb=.. fsdp_70b_gb=..
tp_70b_gb=.. pp_70b_gb=.. (GB each GPU sends per step for that kind of exchange) ckpt_7b_gb=..
ckpt_70b_gb=.. ckpt_70b_s_at_10gbps=.. egress_70b_usd=..
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

from training.planner import (
    GB,
    Fleet,
    Layout,
    ModelShape,
    Training,
    checkpoint_bytes,
    crosses_nodes,
    exchange_bytes,
    infer_shape,
    memory,
    plan,
    step_time,
)

GBPS = 1e9 / 8  # bytes per second of one gigabit per second
CROSS_NODE_LINKS = (("400 Gb/s", 400 * GBPS), ("100 Gb/s", 100 * GBPS), ("10 Gb/s", 10 * GBPS))
CHECKPOINT_LINKS_GBPS = (1, 10, 100)
CHECKPOINT_SIZES = (1e8, 1.3e9, 7e9, 13e9, 70e9)
INTER_REGION_USD_PER_GB = 0.02  # AWS list price between regions: an assumption


@dataclass(frozen=True)
class Case:
    name: str  # the table's row
    key: str  # the RESULT key's stem: ddp, fsdp, tp or pp
    kind: str  # the exchange the RESULT key reports: dp, tp or pp
    dp: int
    tp: int
    pp: int
    fsdp: bool = False


# Per model size: the fleet (nodes of 8) and the layouts compared; each puts one kind of exchange
# in front (the others at 1 where the GPUs allow).
MODELS: tuple[tuple[str, float, int, tuple[Case, ...]], ...] = (
    (
        "7b",
        7e9,
        1,
        (
            Case("DDP, dp 8", "ddp", "dp", 8, 1, 1),
            Case("FSDP, dp 8", "fsdp", "dp", 8, 1, 1, fsdp=True),
            Case("TP 8", "tp", "tp", 1, 8, 1),
            Case("PP 8", "pp", "pp", 1, 1, 8),
        ),
    ),
    (
        "70b",
        70e9,
        8,
        (
            Case("DDP, dp 64", "ddp", "dp", 64, 1, 1),
            Case("FSDP, dp 64", "fsdp", "dp", 64, 1, 1, fsdp=True),
            Case("TP 8 in a node x dp 8", "tp", "tp", 8, 8, 1),
            Case("TP 8 in a node x PP 8 across nodes", "pp", "pp", 1, 8, 8),
        ),
    ),
)


def layout_of(case: Case, train: Training, fleet: Fleet) -> Layout:
    per_step = fleet.gpus * train.micro_batch  # the planner's default global batch
    return Layout(case.dp, case.fsdp, case.tp, case.pp, False, per_step // (case.dp * train.micro_batch))


def row(
    name: str, shape: ModelShape, train: Training, fleet: Fleet, lay: Layout
) -> tuple[str, dict[str, float]]:
    """One table row for a layout: bytes by kind, where they go, memory and times."""
    # Activation checkpointing only when it makes the layout fit (its recomputation costs a third more).
    mem = memory(shape, train, fleet, lay)
    if mem["total"] > fleet.gpu_memory_gb:
        recomputed = replace(lay, activation_checkpointing=True)
        if memory(shape, train, fleet, recomputed)["total"] <= fleet.gpu_memory_gb:
            lay, mem = recomputed, memory(shape, train, fleet, recomputed)
    fits = mem["total"] <= fleet.gpu_memory_gb
    sent = exchange_bytes(shape, train, lay)
    across = crosses_nodes(fleet, lay)
    inside_b = sum(v for k, v in sent.items() if not across[k])
    across_b = sum(v for k, v in sent.items() if across[k])
    unbounded = replace(fleet, intra_node_gbps=math.inf, inter_node_gbps=math.inf)
    batch = lay.microbatches * lay.dp * train.micro_batch
    compute = step_time(shape, train, unbounded, lay, batch)
    inside_s = inside_b / (fleet.intra_node_gbps * GB)
    where = ", ".join(f"{k} {'across' if across[k] else 'inside'}" for k, v in sent.items() if v) or "-"
    cells = [
        name,
        f"{mem['total']:.1f}"
        + (" (recomputed)" if lay.activation_checkpointing else "")
        + ("" if fits else " (does not fit)"),
        *(f"{sent[k] / GB:.3g}" for k in ("dp", "tp", "pp")),
        where,
        f"{compute:.2f}",
        f"{inside_s:.2f}",
        *(f"{across_b / bw:.2f}" if across_b else "-" for _, bw in CROSS_NODE_LINKS),
    ]
    return "| " + " | ".join(cells) + " |", {k: v / GB for k, v in sent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0)
    parser.add_argument(
        "--egress-usd-per-gb",
        type=float,
        default=0.09,
        help="ASSUMED price: AWS's list price out to the internet, first 10 TB a month, US regions",
    )
    args = parser.parse_args()
    train = Training()
    result: dict[str, str] = {}

    head = (
        "| layout | GB per GPU | DP GB sent | TP GB sent | PP GB sent | where | compute s "
        "| inside a node s | "
        + " | ".join(f"across nodes s at {name}" for name, _ in CROSS_NODE_LINKS)
        + " |"
    )
    for size, params, nodes, cases in MODELS:
        shape = infer_shape(params, args.seq_len)
        fleet = Fleet(args.gpu_memory_gb, 8, nodes)
        chosen = plan(shape, train, fleet)
        print(
            f"{size.upper()} ({shape.layers} layers x {shape.hidden}, {shape.heads} heads, assumed), "
            f"{nodes} node(s) x 8 GPUs of {args.gpu_memory_gb:g} GB, sequences of {args.seq_len}, "
            f"{fleet.gpus * train.micro_batch} per step; bytes each GPU sends per step:"
        )
        print()
        print(head)
        print("|" + "---|" * (8 + len(CROSS_NODE_LINKS)))
        for case in cases:
            line, sent = row(case.name, shape, train, fleet, layout_of(case, train, fleet))
            print(line)
            result[f"{case.key}_{size}_gb"] = f"{sent[case.kind]:.3g}"
        s = chosen.strategy
        lay = Layout(
            int(s["dp"]), bool(s["fsdp"]), int(s["tp"]), int(s["pp"]),
            chosen.activation_checkpointing, chosen.microbatches,
        )  # fmt: skip
        name = f"planner's choice: dp {s['dp']}{' FSDP' if s['fsdp'] else ''}, tp {s['tp']}, pp {s['pp']}"
        print(row(name, shape, train, fleet, lay)[0])
        print()

    print(
        "Checkpoints (weights + optimizer state; transfer at line rate; egress at ASSUMED prices: "
        f"${args.egress_usd_per_gb:g}/GB as given, ${INTER_REGION_USD_PER_GB:g}/GB AWS between regions):"
    )
    print()
    print(
        "| parameters | bytes/param | checkpoint GB | "
        + " | ".join(f"at {g} Gb/s" for g in CHECKPOINT_LINKS_GBPS)
        + f" | egress at ${args.egress_usd_per_gb:g}/GB | at ${INTER_REGION_USD_PER_GB:g}/GB |"
    )
    print("|" + "---|" * (5 + len(CHECKPOINT_LINKS_GBPS)))
    for params in CHECKPOINT_SIZES:
        for precision, note in (("bf16", "mixed"), ("fp32", "fp32")):
            size_b = checkpoint_bytes(params, "adamw", precision)
            times = " | ".join(duration(size_b / (g * GBPS)) for g in CHECKPOINT_LINKS_GBPS)
            egress = size_b / GB * args.egress_usd_per_gb
            between = size_b / GB * INTER_REGION_USD_PER_GB
            print(
                f"| {params:.3g} | {size_b / params:g} ({note} AdamW) | {size_b / GB:,.1f} | {times} "
                f"| ${egress:,.2f} | ${between:,.2f} |"
            )
    ckpt_7b = checkpoint_bytes(7e9, "adamw", "bf16")
    ckpt_70b = checkpoint_bytes(70e9, "adamw", "bf16")
    print()
    print(
        "RESULT "
        + " ".join(f"{k}={v}" for k, v in result.items())
        + f" ckpt_7b_gb={ckpt_7b / GB:.0f} ckpt_70b_gb={ckpt_70b / GB:.0f}"
        + f" ckpt_70b_s_at_10gbps={ckpt_70b / (10 * GBPS):.0f}"
        + f" egress_70b_usd={ckpt_70b / GB * args.egress_usd_per_gb:.2f}"
    )


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


if __name__ == "__main__":
    main()
