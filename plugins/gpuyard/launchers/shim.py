"""Runs one worker command and records its exit status in a file, so a restarted launcher that
adopts this process (not its child any more) still learns how the worker ended.

    python -I -m gpuyard.launchers.shim EXIT_FILE [--as UID:GID] -- COMMAND [ARG ...]

The shim is the launcher's helper and runs with the launcher's privileges (root, where workers run as
their teams' users), so it never runs with anything a job chose: it is started in isolated mode
(`-I`: no PYTHON* variable, no user site, no working directory on its path) with an environment of
the launcher's own, and reads the worker's environment as JSON on its standard input. That
environment is applied by the exec of COMMAND only, after `--as` dropped to the team's user
(`privilege_drop`).

SIGTERM and SIGINT are forwarded to the worker (the preemption notice). The status is the
worker's exit code, or minus the signal that killed it, as subprocess reports it. Room for the
status is taken on the disk before the worker starts and overwritten in place at the end, so a disk
that filled up meanwhile cannot refuse it (an adopted worker's launcher has no other way to learn
it). The shim also exits with the status (128 + N for signal N), so a launcher whose child it is
learns it even when the disk was full from the start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuyard.launchers.privilege_drop import exec_options

STATUS_WIDTH = 16  # bytes: any status, padded with spaces (int() ignores them)
USAGE = "usage: python -I -m gpuyard.launchers.shim EXIT_FILE [--as UID:GID] -- COMMAND [ARG ...]"


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


def _parse(argv: list[str]) -> tuple[Path, dict[str, Any], list[str]]:
    """EXIT_FILE, the exec options of `--as` (none without it) and COMMAND; ValueError if malformed."""
    exit_file, rest = Path(argv[0]) if argv else Path(), argv[1:]
    options: dict[str, Any] = {}
    if rest[:1] == ["--as"] and len(rest) > 1:
        uid, _, gid = rest[1].partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            raise ValueError(f"--as wants UID:GID, got {rest[1]!r}")
        options, rest = exec_options(int(uid), int(gid)), rest[2:]
    if not argv or rest[:1] != ["--"] or len(rest) < 2:
        raise ValueError(USAGE)
    return exit_file, options, rest[1:]


def _environment(stream: Any) -> dict[str, str]:
    environment = json.load(stream)
    if not isinstance(environment, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in environment.items()
    ):
        raise ValueError("the worker's environment on standard input must be a JSON object of strings")
    return environment


def main(argv: list[str]) -> int:
    try:
        exit_file, options, command = _parse(argv)
        environment = _environment(sys.stdin)
    except ValueError as error:
        print(f"gpuyard: {error}", file=sys.stderr, flush=True)
        return 2
    partial = exit_file.with_suffix(".tmp")
    reserved = _reserve(partial)
    try:
        worker = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL, **options)
    except (OSError, subprocess.SubprocessError) as error:  # not found, or the drop refused
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
