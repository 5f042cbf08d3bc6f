"""Handing freed heap memory back to the operating system, for long-running services.

glibc's allocator keeps the pages of freed blocks in its heap for reuse and returns them only from
the heap's top. After the scheduler has read a backlog of thousands of jobs, the blocks freed behind
the few still alive stay resident: the process then sits at its peak for good, which a container's
memory limit and a soak test's RSS both see. `malloc_trim(0)` releases every free page, wherever it
lies. Elsewhere than glibc (musl, macOS) there is nothing to call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


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
