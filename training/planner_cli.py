"""`gpuyard plan`: the parallelism planner on the command line (registered by the CLI owner with
`app.command("plan")(plan)`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from training.planner import GPU_TYPES, Fleet, ModelShape, PlanError, Training, infer_shape, shape_params
from training.planner import plan as make_plan


def plan(
    params: Annotated[float | None, typer.Option(help="Parameter count, e.g. 70e9")] = None,
    layers: Annotated[int | None, typer.Option(help="Transformer layers")] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads")] = None,
    vocab: Annotated[int, typer.Option(help="Vocabulary size")] = 32000,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length")] = 2048,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per GPU per forward")] = 1,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="Sequences per step (default: one per GPU)")
    ] = None,
    optimizer: Annotated[str, typer.Option(help="adamw, adam, sgd or adafactor")] = "adamw",
    precision: Annotated[str, typer.Option(help="bf16, fp16 or fp32")] = "bf16",
    gpu_type: Annotated[
        str | None,
        typer.Option(
            "--gpu-type", help=f"One of {', '.join(GPU_TYPES)}: sets memory and TFLOPS unless given"
        ),
    ] = None,
    gpu_memory_gb: Annotated[
        float | None, typer.Option("--gpu-memory-gb", help="Memory per GPU, GB (default 80)")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node")] = 8,
    nodes: Annotated[int, typer.Option(help="Nodes in the fast domain")] = 1,
    intra_node_gbps: Annotated[
        float, typer.Option("--intra-node-gbps", help="GB/s per GPU inside a node (NVLink)")
    ] = 450.0,
    inter_node_gbps: Annotated[
        float, typer.Option("--inter-node-gbps", help="GB/s per GPU between nodes (IB 400G: 50)")
    ] = 50.0,
    gpu_tflops: Annotated[
        float | None, typer.Option("--gpu-tflops", help="Dense 16-bit TFLOPS per GPU (default 989)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON")] = False,
) -> None:
    """Recommend DDP / FSDP / tensor / pipeline parallelism with a per-GPU memory breakdown and reasons."""
    try:
        if optimizer not in ("adamw", "adam", "sgd", "adafactor"):
            raise PlanError(f"--optimizer: expected adamw, adam, sgd or adafactor, got {optimizer!r}")
        if gpu_type is not None and gpu_type.lower() not in GPU_TYPES:
            raise PlanError(f"--gpu-type: expected one of {sorted(GPU_TYPES)}, got {gpu_type!r}")
        type_memory, type_tflops = GPU_TYPES[gpu_type.lower()] if gpu_type else (80.0, 989.0)
        memory_gb = gpu_memory_gb if gpu_memory_gb is not None else type_memory
        tflops = gpu_tflops if gpu_tflops is not None else type_tflops
        if precision not in ("bf16", "fp16", "fp32"):
            raise PlanError(f"--precision: expected bf16, fp16 or fp32, got {precision!r}")
        if layers and hidden:
            shape = ModelShape(
                params or shape_params(layers, hidden, vocab),
                layers,
                hidden,
                heads or max(1, hidden // 128),
                vocab,
                seq_len,
            )
        elif params:
            shape = infer_shape(params, seq_len, vocab)
        else:
            raise PlanError("give --params, or --layers and --hidden (with --heads, --vocab)")
        if shape.hidden % shape.heads:
            raise PlanError(f"--hidden {shape.hidden} is not a multiple of --heads {shape.heads}")
        result = make_plan(
            shape,
            Training(micro_batch, global_batch, optimizer, precision),  # type: ignore[arg-type]
            Fleet(memory_gb, gpus_per_node, nodes, intra_node_gbps, inter_node_gbps, tflops),
        )
    except PlanError as exc:
        typer.echo(f"gpuyard plan: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    s = result.strategy
    typer.echo(
        f"strategy: dp={s['dp']} fsdp={s['fsdp']} tp={s['tp']} pp={s['pp']} "
        f"activation_checkpointing={result.activation_checkpointing} "
        f"microbatches={result.microbatches} "
        f"bubble={result.bubble_fraction:.1%}"
    )
    typer.echo("per-GPU memory (GB):")
    for name, value in result.per_gpu_memory_gb.items():
        typer.echo(f"  {name:<16} {value:9.2f}")
    typer.echo("reasons:")
    for reason in result.reasons:
        typer.echo(f"  - {reason}")
