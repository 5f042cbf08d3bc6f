"""What an idle control plane costs: the CPU a `gpuyard up` with nothing to do spends (its API, relay
and scheduler polling), as a share of one core, after it settled.

    python benchmarks/idle_cost.py [--seconds 60] [--settle 10]

Starts `gpuyard up` in a fresh home (the embedded profile, SQLite), waits `--settle` seconds, then
measures its CPU over `--seconds`; progress on stderr, and
`RESULT idle_up_cpu_percent=P idle_up_wakeups_per_s=W`: CPU seconds per wall second in percent, and
the context switches per second its threads made (each poll of a loop is at least one).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import GpuyardUp  # noqa: E402


def spent(process: psutil.Process) -> tuple[float, int]:
    """CPU seconds (user + system) of the process, and the voluntary context switches of its threads
    (a machine's load does not change them: the less noisy of the two)."""
    times = process.cpu_times()
    switches = 0
    for task in Path(f"/proc/{process.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            lines = (task / "status").read_text().splitlines()
            switches += sum(int(line.split()[1]) for line in lines if line.startswith("voluntary_"))
    return times.user + times.system, switches


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to measure [60]")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds left to start-up first [10]")
    args = parser.parse_args()
    if args.seconds <= 0 or args.settle < 0:
        parser.error("--seconds must be positive and --settle at least 0")
    with tempfile.TemporaryDirectory() as scratch:
        server = GpuyardUp(Path(scratch) / "home").start()
        try:
            process = psutil.Process(server.pid)
            print(f"gpuyard up (pid {server.pid}) started; settling {args.settle:g}s", file=sys.stderr)
            time.sleep(args.settle)
            cpu, switches = spent(process)
            began = time.monotonic()
            print(f"measuring {args.seconds:g}s", file=sys.stderr)
            time.sleep(args.seconds)
            cpu_after, switches_after = spent(process)
            wall = time.monotonic() - began
        finally:
            server.stop()
    percent = 100 * (cpu_after - cpu) / wall
    wakeups = (switches_after - switches) / wall
    print(f"RESULT idle_up_cpu_percent={percent:.2f} idle_up_wakeups_per_s={wakeups:.1f}")


if __name__ == "__main__":
    main()
