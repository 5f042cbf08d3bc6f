"""Runs one worker command and records its exit status in a file, so a restarted launcher that
adopts this process (not its child any more) still learns how the worker ended.

    python -m gpuyard.launchers.shim EXIT_FILE -- COMMAND [ARG ...]

SIGTERM and SIGINT are forwarded to the worker (the preemption notice). The status is the
worker's exit code, or minus the signal that killed it, as subprocess reports it. The shim exits
with the same status (128 + N for signal N), so a launcher whose child it is learns it even when
the file cannot be written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m gpuyard.launchers.shim EXIT_FILE -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    exit_file, command = Path(argv[0]), argv[2:]
    try:
        worker = subprocess.Popen(command)
    except OSError as error:
        print(f"gpuyard: cannot start {command[0]!r}: {error}", file=sys.stderr, flush=True)
        status = 127
    else:
        for notice in (signal.SIGTERM, signal.SIGINT):
            signal.signal(notice, lambda signum, _frame: worker.send_signal(signum))
        status = worker.wait()
    partial = exit_file.with_suffix(".tmp")
    try:
        partial.write_text(str(status))
        os.replace(partial, exit_file)  # atomic: a reader sees no file or the whole status
    except OSError as error:  # a full disk: our exit code still carries the status to the launcher
        with contextlib.suppress(OSError):  # the log is on that disk too
            print(
                f"gpuyard: cannot record the exit status in {exit_file}: {error}", file=sys.stderr, flush=True
            )
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
