"""What a worker that should have ended is doing, for the report of a campaign that never became
quiescent: each process's state, where the kernel has it wait, its freezer cgroup, and its Python
threads' stacks. The training runtime and the suite's light worker register faulthandler on SIGUSR1
(training/run.py, worker.py), which writes every thread's stack to the process's stderr: its log,
read back here through /proc/<pid>/fd/2. Only a process that catches SIGUSR1 is sent it (its default
action ends the process).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

STACK_WAIT_S = 2.0  # how long a process gets to write its stacks (it may be frozen: then nothing comes)
TAIL_CHARS = 1500  # of each process's dump, in the report


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")
    return ""


def catches_sigusr1(pid: int) -> bool:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
    return False


def _state(pid: int) -> str:
    stat = _read(f"/proc/{pid}/stat")
    state = stat.rsplit(") ", 1)[1][0] if ") " in stat else "?"
    wchan = _read(f"/proc/{pid}/wchan") or "-"
    freezer = next(
        (line.split(":", 2)[2] for line in _read(f"/proc/{pid}/cgroup").splitlines() if ":freezer:" in line),
        "",
    )
    command = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()[:160]
    frozen = f", freezer cgroup {freezer}" if freezer not in ("", "/") else ""
    return f"pid {pid} state {state}, waiting in {wchan}{frozen}: {command}"


def describe(pids: list[int]) -> str:
    """Each process's state and, where it catches SIGUSR1, the stacks it wrote on it."""
    logs: dict[int, tuple[str, int]] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            log = os.readlink(f"/proc/{pid}/fd/2")
            if log.startswith("/") and catches_sigusr1(pid):
                logs[pid] = (log, os.path.getsize(log))
                os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not all(MARK in _since(*where) for where in logs.values()):
        time.sleep(0.05)
    time.sleep(0.2 if logs else 0)  # the dump is written thread by thread: let the last ones land
    parts = []
    for pid in pids:
        parts.append(_state(pid))
        if pid in logs:
            dump = _since(*logs[pid])
            parts.append(
                dump[-TAIL_CHARS:] if MARK in dump else "  (no stacks written: frozen, or stuck in C)"
            )
    return "\n".join(parts)


MARK = "most recent call first"  # faulthandler's heading of each thread


def _since(log: str, size: int) -> str:
    """What the log gained past `size`."""
    with contextlib.suppress(OSError), open(log, "rb") as handle:
        handle.seek(size)
        return handle.read().decode(errors="replace")
    return ""
