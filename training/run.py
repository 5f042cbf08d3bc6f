"""Training entry point, on every worker: `python -m training.run --config FILE [--set KEY=VALUE ...]`.

A process the launcher gave a RANK (or a node of one rank) trains as that rank (training/trainer.py).
A Kubernetes pod is one process per node: it starts the node's ranks (training/ranks.py) without
importing torch, which only its ranks need (seconds of every relaunch otherwise). Exit codes: see
training/exit_codes.py. SIGUSR1 prints every thread's stack to the log.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import signal
import sys
from collections.abc import Sequence

from training.ranks import node_ranks, run_node


def main(argv: Sequence[str] | None = None) -> int:
    # `kill -USR1 <pid>` writes every thread's stack to the worker's log (stderr): where a rank that
    # seems hung waits (a collective, the rendezvous, a store), with no debugger in the container.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = argparse.ArgumentParser(prog="python -m training.run", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML training config")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.max_steps=50 (repeatable)",
    )
    args = parser.parse_args(argv)
    if (ranks := node_ranks(os.environ)) is not None:  # one process per node (a pod): start its ranks
        return run_node(ranks, list(sys.argv[1:] if argv is None else argv))
    from training.trainer import run_rank  # torch and the runtime: a rank's, not a node's

    return run_rank(args.config, args.overrides)


if __name__ == "__main__":
    code = main()
    # Exiting, the interpreter's own garbage collections walk every object torch and MLflow made: 1 CPU-s
    # of each rank's exit. Frozen, they are skipped; the atexit handlers (logging's, MLflow's) still run.
    gc.freeze()
    sys.exit(code)
