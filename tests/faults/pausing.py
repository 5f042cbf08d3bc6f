"""Pausing processes for a while, as a long GC pause, a swapped-out VM or a stalled hypervisor does: the
process is still there and holds what it held (connections, leases, locks), but does nothing.

One process: SIGSTOP, then SIGCONT. A whole process tree (an attempt's shims and workers): the cgroup
freezer, which stops every task of the group at once and keeps new children in it, so the tree cannot
notice it is being stopped (SIGSTOP can be seen: a parent's waitpid(WUNTRACED), a shell's job control).
This machine has cgroup v1's freezer (`/sys/fs/cgroup/freezer`); cgroup v2's `cgroup.freeze` is used
where v1's is absent, and SIGSTOP of each process group where neither is (`Frozen.how` says which).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

V1 = Path("/sys/fs/cgroup/freezer")
V2 = Path("/sys/fs/cgroup/unified")
_names = itertools.count()


def group_members(groups: Iterable[int]) -> list[int]:
    """Every live process whose process group is one of `groups`."""
    wanted, found = set(groups), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in wanted:
            found.append(int(entry.name))
    return sorted(found)


def state(pid: int) -> str:
    """The process's state letter (R, S, D, T for stopped, ...), '' if it is gone."""
    try:
        return (Path(f"/proc/{pid}/stat")).read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return ""


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP one process for the block (entered once the kernel shows it stopped); SIGCONT however
    the block ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while state(pid) not in ("T", "t", "") and time.monotonic() < deadline:
            time.sleep(0.001)  # delivery is asynchronous: the target stops when it next runs
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


class Frozen:
    """The processes of some process groups, frozen together (`with Frozen(groups) as frozen:`)."""

    def __init__(self, groups: Iterable[int]):
        self.groups = sorted(set(groups))
        self.pids: list[int] = []
        self.how = "cgroup v1 freezer" if V1.is_dir() else "cgroup v2 freeze" if _v2_usable() else "SIGSTOP"
        self._cgroup: Path | None = None

    def __enter__(self) -> Frozen:
        if self.how == "SIGSTOP":
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGSTOP)
            self.pids = group_members(self.groups)
            return self
        root = V1 if self.how == "cgroup v1 freezer" else V2
        self._cgroup = root / f"gpuyard-faults-{os.getpid()}-{next(_names)}"
        self._cgroup.mkdir()
        try:
            self._join(group_members(self.groups))
            self._set(frozen=True)
            self._join(group_members(self.groups))  # a child forked meanwhile: it joins frozen
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _join(self, pids: list[int]) -> None:
        assert self._cgroup is not None
        for pid in pids:
            if pid in self.pids:
                continue
            with contextlib.suppress(ProcessLookupError, OSError):  # it exited meanwhile
                (self._cgroup / "cgroup.procs").write_text(f"{pid}\n")
                self.pids.append(pid)

    def _set(self, *, frozen: bool) -> None:
        assert self._cgroup is not None
        if self.how == "cgroup v1 freezer":
            (self._cgroup / "freezer.state").write_text("FROZEN\n" if frozen else "THAWED\n")
            wanted = "FROZEN" if frozen else "THAWED"
            deadline = time.monotonic() + 5
            while (self._cgroup / "freezer.state").read_text().strip() != wanted:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self._cgroup} did not become {wanted} within 5 s")
                time.sleep(0.01)
        else:
            (self._cgroup / "cgroup.freeze").write_text("1\n" if frozen else "0\n")

    def __exit__(self, *_: object) -> None:
        if self.how == "SIGSTOP":
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGCONT)
            return
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is None:
            return
        self._cgroup = cgroup
        try:
            self._set(frozen=False)
        finally:
            self._cgroup = None
            parent = cgroup.parent / "cgroup.procs"
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, OSError):
                    parent.write_text(f"{pid}\n")
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def _v2_usable() -> bool:
    return (V2 / "cgroup.procs").exists() and os.access(V2, os.W_OK)


def thaw_all() -> list[Path]:
    """Thaw and remove every freezer group this process made and left (a campaign interrupted while
    a tree was frozen: a frozen task does not even die of SIGKILL until thawed). Returns them."""
    left = []
    for root in (V1, V2):
        for cgroup in root.glob(f"gpuyard-faults-{os.getpid()}-*"):
            frozen = Frozen([])
            frozen.how = "cgroup v1 freezer" if root == V1 else "cgroup v2 freeze"
            frozen._cgroup = cgroup
            frozen.__exit__(None, None, None)
            left.append(cgroup)
    return left
