"""An exclusive lock on a file, across the processes of this machine (flock)."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path


class LockBusy(TimeoutError):
    """Another process held the lock for longer than the caller would wait (it may be paused)."""


@contextlib.contextmanager
def exclusive(path: Path, *, wait_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing; the kernel releases it if we die).
    With `wait_s`, raise LockBusy instead of waiting longer for it."""
    with open(path, "a") as handle:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockBusy(f"{path} held by another process for over {wait_s:g} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
