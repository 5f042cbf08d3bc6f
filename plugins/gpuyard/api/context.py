"""What the API's handlers share: settings, the engine, the fleet, the clock, and short-lived caches."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from gpuyard.clock import Clock
from gpuyard.domain.fleet import Fleet
from gpuyard.settings import Settings
from gpuyard.store.submitter import Submitter

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """A small thread-safe cache: tokens and quotas are read on every submit but change rarely."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000):
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def peek(self, key: K) -> tuple[bool, V | None]:
        """(found, value) without loading."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] > time.monotonic():
            return True, entry[1]
        return False, None

    def get(self, key: K, load: Callable[[K], V]) -> V:
        found, value = self.peek(key)
        if found:
            return value  # type: ignore[return-value]
        now = time.monotonic()
        value = load(key)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (now + self.ttl_s, value)
        return value

    async def get_async(self, key: K, load: Callable[[K], V]) -> V:
        """get() for the event loop: a hit costs no hop to a worker thread, a miss loads in one."""
        found, value = self.peek(key)
        if found:
            return value  # type: ignore[return-value]
        return await run_in_threadpool(self.get, key, load)

    def forget(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


@dataclass
class ApiContext:
    settings: Settings
    engine: Engine
    submitter: Submitter  # the hot path's own way to the store (see store/submitter.py)
    fleet: Fleet
    clock: Clock
    logs: Callable[[str, bool], Iterator[str]] | None = None  # (attempt id, follow) -> lines
    # Revocations and quota edits reach other API replicas within these TTLs.
    principals: TtlCache = field(default_factory=lambda: TtlCache(ttl_s=5.0))
    quotas: TtlCache = field(default_factory=lambda: TtlCache(ttl_s=5.0))
    # check_feasible by (resources, sites), all it reads: the fleet is fixed for this process, and
    # walking thousands of nodes would cost milliseconds per submit.
    feasibility: TtlCache = field(default_factory=lambda: TtlCache(ttl_s=float("inf")))
