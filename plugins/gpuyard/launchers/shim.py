"""Runs one worker command and records its exit status in a file, so a restarted launcher that
adopts this process (not its child any more) still learns how the worker ended.

    python -m gpuyard.launchers.shim EXIT_FILE -- COMMAND [ARG ...]

SIGTERM and SIGINT are forwarded to the worker (the preemption notice). The status is the
worker's exit code, or minus the signal that killed it, as subprocess reports it. Room for the
status is taken on the disk before the worker starts and overwritten in place at the end, so a disk
that filled up meanwhile cannot refuse it (an adopted worker's launcher has no other way to learn
it). The shim also exits with the status (128 + N for signal N), so a launcher whose child it is
learns it even when the disk was full from the start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

STATUS_WIDTH = 16  # bytes: any status, padded with spaces (int() ignores them)


def _reserve(partial: Path) -> bool:
    """Take the disk room for the status now, while there may be some."""
    try:
        with open(partial, "w") as record:
            record.write(" " * STATUS_WIDTH)
            record.flush()
            os.fsync(record.fileno())
        return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m gpuyard.launchers.shim EXIT_FILE -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    exit_file, command = Path(argv[0]), argv[2:]
    partial = exit_file.with_suffix(".tmp")
    reserved = _reserve(partial)
    try:
        worker = subprocess.Popen(command)
    except OSError as error:
        print(f"gpuyard: cannot start {command[0]!r}: {error}", file=sys.stderr, flush=True)
        status = 127
    else:
        for notice in (signal.SIGTERM, signal.SIGINT):
            signal.signal(notice, lambda signum, _frame: worker.send_signal(signum))
        status = worker.wait()
    try:
        with open(partial, "r+" if reserved else "w") as record:  # r+: in place, in the room taken
            record.write(f"{status:<{STATUS_WIDTH}}")
        os.replace(partial, exit_file)  # atomic: a reader sees no file or the whole status
    except OSError as error:  # a full disk: our exit code still carries the status to the launcher
        with contextlib.suppress(OSError):  # the log is on that disk too
            print(
                f"gpuyard: cannot record the exit status in {exit_file}: {error}", file=sys.stderr, flush=True
            )
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
