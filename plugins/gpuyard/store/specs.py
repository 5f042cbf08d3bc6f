"""The parsed JobSpecs of the jobs a reader goes over again and again: a cache its reader owns.

A job's spec is written once, at submit, and JobSpec is frozen, so a reader that reads the same
jobs every pass (the scheduler reads every pending and live job's row each pass) validates each once,
not on every read. What it keeps is bounded twice: by `max_entries` (the least recently read go
first), and by `sweep()`: an entry not read since the previous sweep is dropped. A reader that sweeps
once a pass keeps the specs of the jobs its passes still read, and a job that ended, whichever
process ended it, leaves the cache at the next sweep: the cache follows the store, level-triggered,
with no hook on any transition. Keyed by job and spec hash, never shared between jobs of one spec, so
what it costs grows with the jobs alive, as a fleet of distinct jobs makes it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from gpuyard.domain.spec import JobSpec


class SpecCache:
    def __init__(self, max_entries: int = 20_000):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], JobSpec] = OrderedDict()  # least recently read first
        self._read: set[tuple[str, str]] = set()  # read since the last sweep
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def job_ids(self) -> set[str]:
        """The jobs whose specs it holds."""
        with self._lock:
            return {job_id for job_id, _ in self._entries}

    def get(self, job_id: str, spec_hash: str, spec: dict[str, Any]) -> JobSpec:
        """The JobSpec of the row's `spec`, validated on the first read of (job, hash) only."""
        key = (job_id, spec_hash)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self._read.add(key)
                return found
        parsed = JobSpec.model_validate(spec)  # outside the lock: readers of other jobs go on
        with self._lock:
            self._entries[key] = parsed
            self._entries.move_to_end(key)
            self._read.add(key)
            while len(self._entries) > self.max_entries:
                oldest, _ = self._entries.popitem(last=False)
                self._read.discard(oldest)
        return parsed

    def sweep(self) -> int:
        """Drop every entry not read since the previous sweep; returns how many were dropped."""
        with self._lock:
            gone = [key for key in self._entries if key not in self._read]
            for key in gone:
                del self._entries[key]
            self._read = set()
            return len(gone)
