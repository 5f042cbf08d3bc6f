"""A process named by its pid and its start time, so that a pid recorded before a restart never
names the process that has that pid now (the kernel reuses pids).

The start time is field 22 of /proc/<pid>/stat (clock ticks after boot): two processes that ever
had the same pid on one boot differ in it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When the process now holding `pid` started (clock ticks after boot); None if there is none."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None  # field 22 of the whole line


@dataclass(frozen=True)
class Proc:
    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> Proc:
        """The process that holds `pid` now (one this launcher just started)."""
        started = start_time(pid)
        if started is None:
            raise ProcessLookupError(pid)
        return cls(pid, started)

    def alive(self) -> bool:
        """It runs: the pid is still this process's, and it has not exited (a zombie has)."""
        fields = _stat(self.pid)
        return fields is not None and int(fields[19]) == self.started and fields[0] != "Z"

    def signal_followers(self, signum: int) -> None:
        """Signal every process of the group it leads but itself (a shim's worker and the worker's
        children, never the shim); the whole group once the leader is gone."""
        if start_time(self.pid) != self.started:
            self.signal_group(signum)
            return
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[2]) == self.pid:  # field 5: the process group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signum)

    def signal_group(self, signum: int) -> None:
        """Signal the process group it leads (the worker's children too), never another process that
        was given the pid since. With the leader gone, its group may live on: the kernel reuses no
        pid that still names a group, so a pid no process holds can only be that group's."""
        if start_time(self.pid) in (None, self.started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)
