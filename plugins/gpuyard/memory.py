"""Handing freed heap memory back to the operating system, for long-running services.

glibc's allocator keeps the pages of freed blocks in its heap for reuse and returns them only from
the heap's top. After the scheduler has read a backlog of thousands of jobs, the blocks freed behind
the few still alive stay resident: the process then sits at its peak for good, which a container's
memory limit and a soak test's RSS both see. `malloc_trim(0)` releases every free page, wherever it
lies. Elsewhere than glibc (musl, macOS) there is nothing to call, and nothing is done.

That reaches only what Python asks of the C allocator. Python's own allocator (pymalloc) serves
every object of 512 bytes or less from 1 MiB arenas, and gives an arena back only when every object
in it is gone: a pass over 10,000 jobs fills arenas, and the few objects that outlive it (a cached
spec, a recorded reason) pin them. `benchmarks/load.py` measured the scheduler keeping 33 MB per
10,000 jobs of a burst on pymalloc, and nothing on the C allocator with `malloc_trim` (2026-12-05).
So the long-running services that read backlogs run on the C allocator (`run_on_c_allocator`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)


def release_free_memory() -> bool:
    """Return the heap's free pages to the OS; True where the allocator could be asked to."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def run_on_c_allocator() -> None:
    """Make this process run on the C allocator, so `release_free_memory` reaches every freed object:
    it is executed again in place (the same pid) with `PYTHONMALLOC=malloc`, which Python reads only
    at its start. Call it first thing, before any thread starts. Nothing is done where an operator
    chose an allocator (PYTHONMALLOC set, `pymalloc` included) or where there is no `malloc_trim`."""
    if os.environ.get("PYTHONMALLOC") or _malloc_trim() is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, "PYTHONMALLOC": "malloc"})
