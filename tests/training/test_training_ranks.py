"""A node's ranks (training/ranks.py), started as a pod's one process starts them: real processes,
real signals. The ranks here are small scripts, not the runtime: what is tested is the node's rule."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from training import exit_codes

# Rank 0 fails at once; rank 1 ignores SIGTERM and waits forever, as a rank blocked in a collective
# with the failed one does (it reads SIGTERM between steps only). It says when it is ready, so the
# failure comes after its handler is installed.
RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    rank = int(os.environ["RANK"])
    folder = Path(sys.argv[1])
    if rank == 0:
        while not (folder / "ready").exists():
            time.sleep(0.02)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: (folder / "sigterm").touch())
    (folder / "ready").touch()
    while True:
        time.sleep(1)
    """
)


def node(script: Path, folder: Path, stop_grace_s: float = 10.0) -> subprocess.CompletedProcess[str]:
    """A pod's one process: two ranks of `script` (run_node installs signal handlers: not in pytest's
    own process)."""
    code = (
        "import sys; from training.ranks import node_ranks, run_node; "
        "ranks = node_ranks({'NNODES': '1', 'NPROC_PER_NODE': '2'}); "
        "sys.exit(run_node(ranks, [sys.argv[2]], entry=(sys.argv[1],), stop_grace_s=float(sys.argv[3])))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(script), str(folder), str(stop_grace_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=60)  # the bound of a node that never returns
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its ranks too, whatever happened
    return subprocess.CompletedProcess(process.args, process.returncode, output)


def test_a_rank_that_ignores_the_stop_after_its_peer_failed_is_killed_after_the_grace(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    ended = node(script, tmp_path, stop_grace_s=0.5)
    assert (tmp_path / "sigterm").exists(), "the surviving rank was asked to stop first"
    assert ended.returncode == 3, ended.stdout  # the failed rank's code, not the kill's


def test_a_gang_that_ends_well_returns_its_ranks_combined_code(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text("import os, sys; sys.exit(75 if os.environ['RANK'] == '1' else 0)")
    assert node(script, tmp_path).returncode == exit_codes.PREEMPTED
