"""Why nothing synchronous crosses sites, measured: one DDP job (gloo, CPU, two workers) on loopback, then
with its two workers in two network namespaces joined by a veth pair that `tc tbf` limits to
`--mbit` (100 Mbit/s) on both ends, gloo pinned to the veth (`GLOO_SOCKET_IFNAME`). netem's delay is
not available on this kernel: the link's latency stays modelled, only its rate is real.

The model is an MLP whose gradients are tens of MB (`--width`, `--layers`). Per run, the median of the
timed steps (after warm-up ones). The planner's model of the same step (training/planner.py,
`exchange_bytes` and `exposed_exchange_s`, as `step_time` charges it): the measured loopback step plus
its DDP exchange at the link's rate, less what the planner has overlap the backward pass (half the
exchange at most, and no more than the backward pass, two thirds of the loopback step). Prints

    RESULT wan_step_slowdown=S model_step_slowdown=M

S: the measured WAN step over the loopback step; M: the planner's WAN step over the loopback step.
Goal: M within 25% of S.

    python benchmarks/wan_ddp.py [--mbit 100] [--width 1024] [--layers 8] [--steps 5]

Needs root (network namespaces, tc); a worker is `python benchmarks/wan_ddp.py --worker OUT`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_cluster.network import ip  # noqa: E402

from training import planner  # noqa: E402

LINK = ("10.231.7.1", "10.231.7.2")  # the two ends of the veth pair, one per namespace


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def model(width: int, layers: int) -> nn.Module:
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)))


def worker(out: Path, width: int, layers: int, batch: int, warmup: int, steps: int) -> None:
    """One rank: DDP steps on random data; rank 0 writes each timed step's seconds."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    replicated = DistributedDataParallel(model(width, layers))
    optimizer = torch.optim.SGD(replicated.parameters(), lr=1e-3)
    data = torch.randn(batch, width)
    times = []
    for step in range(warmup + steps):
        dist.barrier()
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        replicated(data).pow(2).mean().backward()  # DDP's all-reduce: overlapped with this backward
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - began)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(times))
    dist.destroy_process_group()


class Link:
    """Two network namespaces joined by a veth pair, each end's egress limited by tc tbf."""

    def __init__(self, mbit: float):
        self.mbit = mbit
        self.namespaces = (f"gy-wan-a-{os.getpid()}", f"gy-wan-b-{os.getpid()}")
        self.ends = (f"gywa{os.getpid() % 10000}", f"gywb{os.getpid() % 10000}")

    def __enter__(self) -> Link:
        for namespace in self.namespaces:
            ip("netns", "add", namespace)
        ip("link", "add", self.ends[0], "type", "veth", "peer", "name", self.ends[1])
        for namespace, end, address in zip(self.namespaces, self.ends, LINK, strict=True):
            ip("link", "set", end, "netns", namespace)
            inside = ("netns", "exec", namespace, "ip")
            ip(*inside, "addr", "add", f"{address}/30", "dev", end)
            ip(*inside, "link", "set", end, "up")
            ip(*inside, "link", "set", "lo", "up")
            # burst: a few packets at line rate; latency: how long a packet may queue behind the limit
            limit = ("tbf", "rate", f"{self.mbit}mbit", "burst", "64kb", "latency", "400ms")
            ip("netns", "exec", namespace, "tc", "qdisc", "add", "dev", end, "root", *limit)
        return self

    def __exit__(self, *_: object) -> None:
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def run_job(args: argparse.Namespace, out: Path, link: Link | None) -> list[float]:
    """The two ranks, on loopback (no link) or one at each end of the link; rank 0's step times."""
    argv = [sys.executable, __file__, "--worker", str(out)]
    argv += ["--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch)]
    argv += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    processes = []
    for rank in range(2):
        env = os.environ | {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": LINK[0] if link else "127.0.0.1",
            "MASTER_PORT": "29500" if link else str(29700 + os.getpid() % 200),
            "GLOO_SOCKET_IFNAME": link.ends[rank] if link else "lo",
            "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore",
        }
        command = ["ip", "netns", "exec", link.namespaces[rank], *argv] if link else argv
        processes.append(subprocess.Popen(command, env=env))
    if any(process.wait(timeout=1800) for process in processes):
        raise RuntimeError("a worker failed")
    return list(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mbit", type=float, default=100.0, help="the link's rate, each way [100]")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512, help="rows per rank and step")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.width, args.layers, args.batch, args.warmup, args.steps)
        return
    if os.geteuid() != 0:
        parser.error("network namespaces and tc need root")
    params = sum(p.numel() for p in model(args.width, args.layers).parameters())
    log(f"{params / 1e6:.1f}M parameters ({params * 4 / 1e6:.0f} MB of fp32 gradients), 2 workers")
    with TemporaryDirectory(prefix="gpuyard-wan-") as scratch:
        log("on loopback ...")
        loopback = statistics.median(run_job(args, Path(scratch) / "loopback.json", None))
        log(f"  {loopback:.3f} s per step; over a {args.mbit:g} Mbit/s link ...")
        with Link(args.mbit) as link:
            wan = statistics.median(run_job(args, Path(scratch) / "wan.json", link))
        log(f"  {wan:.3f} s per step")
    rate = args.mbit * 1e6 / 8  # bytes per second, each way
    shape = planner.ModelShape(float(params), args.layers, args.width, 1, 1, 1)
    train = planner.Training(precision="fp32")
    sent = planner.exchange_bytes(shape, train, planner.Layout(2, False, 1, 1, False, 1))["dp"]
    # step_time's rule; the loopback step is the compute (its exchange on loopback is small beside it)
    modelled = loopback + planner.exposed_exchange_s(sent / rate, loopback)
    link = f"over {args.mbit:g} Mbit/s"
    print(f"loopback step {loopback:.3f} s; {link} {wan:.3f} s measured, {modelled:.3f} s modelled")
    exchange = f"{sent / 1e6:.1f} MB per worker and step, {sent / rate:.2f} s at the link's rate"
    print(f"the planner's DDP exchange: {exchange}")
    print(f"RESULT wan_step_slowdown={wan / loopback:.2f} model_step_slowdown={modelled / loopback:.2f}")


if __name__ == "__main__":
    main()
