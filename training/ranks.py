"""A node's ranks, started by the runtime itself where the launcher starts one process per node.

The local launcher starts one process per GPU and gives each its RANK. A Kubernetes pod is one
container per node: its launcher describes the gang (NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR,
MASTER_PORT, the variables torchrun reads) and the entry point starts the node's ranks here. Unlike
torchrun's elastic agent, which reports any worker's failure as exit 1, the node exits with its
ranks' own codes combined as the launchers combine a gang's (`gang_exit`): a preemption stays 75.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from training import exit_codes

STOP_GRACE_S = 10.0  # after a rank failed, how long the others get to stop on SIGTERM (the local launcher's)


def node_ranks(env: Mapping[str, str]) -> list[dict[str, str]] | None:
    """Each local rank's variables, when this process is a node of several ranks without its own RANK
    (else None: it is a rank, or the node has only one)."""
    if "RANK" in env:
        return None
    nodes, per_node = int(env.get("NNODES", "1")), int(env.get("NPROC_PER_NODE", "1"))
    if nodes * per_node <= 1:
        return None
    node = int(env.get("NODE_RANK", "0"))
    return [
        {
            "RANK": str(node * per_node + local),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(nodes * per_node),
            "LOCAL_WORLD_SIZE": str(per_node),
            "GROUP_RANK": str(node),
        }
        for local in range(per_node)
    ]


def gang_exit(codes: Sequence[int]) -> int:
    """A gang's code from its ranks': the first failure, else a preemption, else success."""
    failed = [code for code in codes if code not in (exit_codes.SUCCESS, exit_codes.PREEMPTED)]
    if failed:
        return failed[0]
    return exit_codes.PREEMPTED if exit_codes.PREEMPTED in codes else exit_codes.SUCCESS


def run_node(
    ranks: list[dict[str, str]],
    argv: Sequence[str],
    entry: Sequence[str] = ("-m", "training.run"),
    stop_grace_s: float = STOP_GRACE_S,
) -> int:
    """Start `python <entry> argv` once per rank (the runtime's entry point, or a wrapper of it: the
    fault suite's journaling one), pass SIGTERM and SIGINT on (the preemption notice), stop the others
    when one fails, and wait for all; a rank killed by signal N counts as 128 + N.

    A rank reads SIGTERM between steps only, and one blocked in a collective with the failed rank
    never reaches the next step (gloo waits 30 minutes): those still running `stop_grace_s` after the
    SIGTERM are killed, as a kubelet kills a container after its grace period. Without it the pod
    would run on, its launcher renewing the attempt's lease all along."""
    children = [
        subprocess.Popen([sys.executable, *entry, *argv], env={**os.environ, **rank}) for rank in ranks
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for notice in (signal.SIGTERM, signal.SIGINT):
        signal.signal(notice, forward)
    kill_at: float | None = None
    while any(child.poll() is None for child in children):
        ended = [child.returncode for child in children if child.returncode is not None]
        if kill_at is None and any(code not in (exit_codes.SUCCESS, exit_codes.PREEMPTED) for code in ended):
            kill_at = time.monotonic() + stop_grace_s  # a rank failed: the others would wait for it
            forward(signal.SIGTERM, None)
        elif kill_at is not None and time.monotonic() >= kill_at:
            forward(signal.SIGKILL, None)
        time.sleep(0.2)
    return gang_exit(
        [128 - child.returncode if child.returncode < 0 else child.returncode for child in children]
    )
