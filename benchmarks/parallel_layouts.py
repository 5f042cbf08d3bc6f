"""The transformer's parallel layouts (training/layouts.py) run and measured on CPU ranks over gloo.

1. Same computation and resume: the gangs of tests/training/layouts_gang.py (4 ranks, every layout
   against one process; then 2 ranks resuming checkpoints across layouts). `max_loss_gap` is the
   largest relative per-step loss difference from one process, `resumed_pairs` the resumes across
   layouts that continued within 1e-5.
2. Cost: each of six layouts (ddp, fsdp, tp, pp with 1F1B, fsdp_tp, pp_dp; and `ddp_exact`, DDP
   with the float64 average that makes its resumes bit for bit) trains a larger model
   (`--width`, `--layers`, ...) on `--ranks` ranks, in a network namespace of its own so that its
   loopback's counters see only its traffic. Per layout: the step time (median of the timed steps),
   each rank's peak tensor memory (`MemTracker`, from torch.distributed._tools: parameters, gradients,
   optimizer state, activations and temporaries, not the process's RSS) and the bytes each rank hands
   to collectives and to send/recv per step (a dispatch mode summing their tensors) beside the bytes the
   namespace's loopback carried per rank and step (gloo's algorithms and TCP framing included); and
   the planner's estimates for the same layout on a CPU profile (fp32, no device reserve, the flash
   kernel CPU attention uses).

Prints a table and

    RESULT layouts=L resumed_pairs=P max_loss_gap=D fsdp_mem_vs_ddp=F planner_mem_error=E

(L: the layouts that ran; F: FSDP's peak per rank over DDP's; E: the largest relative error of the
planner's per-rank memory against MemTracker's peak, over the six: the planner models plain DDP).
Goals: all six layouts run; P >= 4; F <= 0.6
on 4 ranks; E <= 0.2.

    python benchmarks/parallel_layouts.py [--ranks 4] [--steps 4] [--width 512] [--layers 4]

Needs root (network namespaces); a rank of a measurement is `python benchmarks/parallel_layouts.py
--rank-of LAYOUT OUT` inside one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "training"))  # the equivalence and resume gangs

import layouts_gang as gang  # noqa: E402
from local_cluster.network import ip  # noqa: E402

from training import planner  # noqa: E402
from training.layouts import LayoutSpec, parallelize  # noqa: E402
from training.transformer import Transformer, TransformerSpec, synthetic_tokens  # noqa: E402

MEASURED = {  # label -> how it runs on 4 ranks
    "ddp": LayoutSpec("ddp", exact=False),  # as the planner models it
    "ddp_exact": LayoutSpec("ddp"),  # gradients averaged in float64: bit-for-bit resumes
    "fsdp": LayoutSpec("fsdp"),
    "tp": LayoutSpec("tp"),
    "pp": LayoutSpec("pp", schedule="1f1b"),
    "fsdp_tp": LayoutSpec("fsdp_tp", tp=2),
    "pp_dp": LayoutSpec("pp_dp", pp=2),
}
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Sizes:
    ranks: int
    steps: int
    batch: int
    width: int
    layers: int
    heads: int
    vocab: int
    seq_len: int

    def model(self) -> TransformerSpec:
        return TransformerSpec(self.vocab, self.width, self.heads, self.layers, self.seq_len)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- a rank of a measurement ------------------------------------------------------------------------


class SentBytes(TorchDispatchMode):
    """Bytes of the tensors this rank hands to collectives and to send (c10d's ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace in ("c10d", "_c10d_functional") and not func.__name__.startswith(
            ("recv", "barrier")
        ):
            tensors = [
                a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)
            ]
            self.sent += sum(t.numel() * t.element_size() for t in tensors[:1] or ())
        return func(*args, **(kwargs or {}))


class PeakTracker(MemTracker):
    """MemTracker for a step that calls its root module once per micro-batch (a pipeline stage): a root
    module's statistics restart at each call, which MemTracker refuses otherwise; the device peaks,
    which this benchmark reads, run on."""

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        at_root = set(self._mod_tracker.parents) - {name} == {"Global"}
        if module in self.memory_tracking and not self._mod_tracker.is_bw and at_root:
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)


def _loopback_bytes() -> int:
    return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())


def measure_rank(label: str, sizes: Sizes, out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = sizes.model()
    torch.manual_seed(0)
    parallel = parallelize(Transformer(spec), MEASURED[label])
    optimizer = torch.optim.AdamW(parallel.model.parameters(), lr=1e-3)
    batches = list(synthetic_tokens(spec, (sizes.steps + 1) * sizes.batch, 1).split(sizes.batch))
    parallel.step(batches[0], optimizer)  # warm-up: lazy state (optimizer moments, FSDP's buffers)
    tracker, counted = PeakTracker(), SentBytes()
    tracker.track_external(parallel.model, optimizer)
    times = []
    dist.barrier()
    wire_before = _loopback_bytes()
    with tracker:
        for tokens in batches[1:]:
            began = time.perf_counter()
            with counted:
                parallel.step(tokens, optimizer)
            times.append(time.perf_counter() - began)
            tracker.reset_mod_stats()
    dist.barrier()
    wire = _loopback_bytes() - wire_before
    peak = sum(stats["Total"] for stats in tracker.get_tracker_snapshot("peak").values())
    found = {
        "step_s": statistics.median(times),
        "peak_bytes": peak,
        "sent_per_step": counted.sent / sizes.steps,
        "wire_per_rank_step": wire / sizes.ranks / sizes.steps,  # the namespace's loopback: all ranks
    }
    (out / f"{label}-rank{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


# -- the driver ------------------------------------------------------------------------------------


def _in_namespace(name: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", name, *argv]


def measure(label: str, sizes: Sizes, out: Path) -> list[dict[str, float]]:
    """One gang of `sizes.ranks` ranks of `label` in a network namespace of its own."""
    namespace = f"gy-layouts-{os.getpid()}-{label}"
    ip("netns", "add", namespace)
    try:
        ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        argv = [sys.executable, __file__, "--rank-of", label, str(out), "--sizes", json.dumps(asdict(sizes))]
        ranks = []
        for rank in range(sizes.ranks):
            env = os.environ | {
                "RANK": str(rank),
                "WORLD_SIZE": str(sizes.ranks),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",  # the namespace's own loopback: no other gang there
                "OMP_NUM_THREADS": "1",
                "PYTHONWARNINGS": "ignore",
            }
            log_file = (out / f"{label}-rank{rank}.log").open("wb")
            ranks.append(
                subprocess.Popen(_in_namespace(namespace, argv), env=env, stdout=log_file, stderr=log_file)
            )
        codes = [process.wait(timeout=900) for process in ranks]
        if any(codes):
            tail = (out / f"{label}-rank0.log").read_text()[-3000:]
            raise RuntimeError(f"{label}: ranks exited {codes}\n{tail}")
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    return [json.loads((out / f"{label}-rank{rank}.json").read_text()) for rank in range(sizes.ranks)]


def planned(label: str, sizes: Sizes) -> tuple[float, float]:
    """The planner's per-rank memory (bytes) and bytes sent per step for `label` on a CPU profile."""
    spec, layout = sizes.model(), MEASURED[label]
    tp = {"tp": sizes.ranks, "fsdp_tp": layout.tp}.get(layout.name, 1)
    pp = {"pp": sizes.ranks, "pp_dp": layout.pp}.get(layout.name, 1)
    dp = sizes.ranks // (tp * pp)
    microbatches = pp if pp > 1 else 1
    params = float(sum(p.numel() for p in Transformer(spec).parameters()))
    shape = planner.ModelShape(params, spec.layers, spec.width, spec.heads, spec.vocab, spec.seq_len)
    train = planner.Training(
        micro_batch=sizes.batch // (dp * microbatches),
        optimizer="adamw",
        precision="fp32",
        flash_attention=True,
    )
    fleet = planner.Fleet(gpu_memory_gb=64.0, gpus_per_node=sizes.ranks, reserve_gb=0.0)
    lay = planner.Layout(dp, layout.name in ("fsdp", "fsdp_tp", "pp_dp"), tp, pp, False, microbatches)
    memory = planner.memory(shape, train, fleet, lay)
    sent = planner.exchange_bytes(shape, train, lay)
    return (memory["total"] - memory["reserve"]) * planner.GB, sum(sent.values())


def equivalence_and_resume(work: Path) -> tuple[float, int]:
    """The test gangs, run again: the largest relative loss gap from one process, and the resumes
    across layouts that continued within the tolerance."""
    reference = gang.reference_losses()
    found: dict[str, list[dict[str, Any]]] = {}
    for name, ranks in (("four", gang.RANKS), ("two", 2)):
        argv = [sys.executable, gang.__file__, str(work), name]
        base = os.environ | {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29400 + ranks),
            "OMP_NUM_THREADS": "1",
        }
        processes = [
            subprocess.Popen(
                argv, env=base | {"RANK": str(r), "WORLD_SIZE": str(ranks), "PYTHONWARNINGS": "ignore"}
            )
            for r in range(ranks)
        ]
        if any(process.wait(timeout=600) for process in processes):
            raise RuntimeError(f"the {name} gang failed")
        found[name] = [json.loads((work / f"{name}-rank{r}.json").read_text()) for r in range(ranks)]

    def gap(losses: list[float], expected: list[float]) -> float:
        return max(abs(a - b) / abs(b) for a, b in zip(losses, expected, strict=True))

    gaps = [gap(rank[label]["losses"], reference) for rank in found["four"] for label in gang.LAYOUTS]
    resumed = sum(
        all(gap(rank[label], reference[gang.HALF :]) <= TOLERANCE for rank in found["two"])
        for label in gang.ACROSS
    )
    return max(gaps), resumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per layout, after one warm-up")
    parser.add_argument("--batch", type=int, default=8, help="sequences per global batch")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rank-of", nargs=2, metavar=("LAYOUT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        measure_rank(args.rank_of[0], Sizes(**json.loads(args.sizes)), Path(args.rank_of[1]))
        return
    if os.geteuid() != 0:
        parser.error("network namespaces need root")
    sizes = Sizes(
        args.ranks, args.steps, args.batch, args.width, args.layers, args.heads, args.vocab, args.seq_len
    )
    with TemporaryDirectory(prefix="gpuyard-layouts-") as scratch:
        work = Path(scratch)
        log("same computation and resume: the test gangs (4 ranks, then 2)")
        max_gap, resumed = equivalence_and_resume(work)
        log(f"  largest loss gap {max_gap:.2e}; {resumed} of {len(gang.ACROSS)} resumes across layouts")
        rows: dict[str, dict[str, float]] = {}
        for label in MEASURED:
            log(f"measuring {label} on {sizes.ranks} ranks ...")
            ranks = measure(label, sizes, work)
            estimate, estimate_sent = planned(label, sizes)
            peak = max(rank["peak_bytes"] for rank in ranks)
            rows[label] = {
                "step_s": statistics.median(rank["step_s"] for rank in ranks),
                "peak_mb": peak / 1e6,
                "planned_mb": estimate / 1e6,
                "sent_mb": max(rank["sent_per_step"] for rank in ranks) / 1e6,
                "wire_mb": ranks[0]["wire_per_rank_step"] / 1e6,
                "planned_sent_mb": estimate_sent / 1e6,
                "error": abs(estimate - peak) / peak,
            }
    params = sum(p.numel() for p in Transformer(sizes.model()).parameters())
    tokens = f"global batch {sizes.batch} x {sizes.seq_len} tokens"
    print(f"{params / 1e6:.1f}M parameters, {sizes.ranks} ranks, {tokens}, fp32")
    heads = ("step s", "peak MB", "planned", "error", "sent MB", "wire MB", "planned")
    print(f"{'layout':9} " + " ".join(f"{head:>8}" for head in heads))
    for label, row in rows.items():
        memory = f"{row['step_s']:8.3f} {row['peak_mb']:8.1f} {row['planned_mb']:8.1f} {row['error']:8.1%}"
        sent = f"{row['sent_mb']:8.2f} {row['wire_mb']:8.2f} {row['planned_sent_mb']:8.2f}"
        print(f"{label:9} {memory} {sent}")
    planned_layouts = [label for label in rows if label != "ddp_exact"]  # the planner models plain DDP
    fsdp_vs_ddp = rows["fsdp"]["peak_mb"] / rows["ddp"]["peak_mb"]
    error = max(rows[label]["error"] for label in planned_layouts)
    print(
        f"RESULT layouts={','.join(planned_layouts)} resumed_pairs={resumed} max_loss_gap={max_gap:.2e} "
        f"fsdp_mem_vs_ddp={fsdp_vs_ddp:.3f} planner_mem_error={error:.3f}"
    )


if __name__ == "__main__":
    main()
