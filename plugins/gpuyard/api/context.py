"""What the API's handlers share: settings, the engine, the fleet, the clock, and short-lived caches.

Every cache is bounded and evicts its least recently used entries when full (never all of them), and
loads a missing key once however many requests wait for it (no stampede on the store when a popular
entry expires). Tokens are cached for half a second, so a revocation or an expiry reaches every API
replica within one second; unknown tokens have a cache of their own, so a flood of bogus tokens
evicts only bogus tokens. Teams (quota and admission policy) are cached for five seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cachetools import TTLCache
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from gpuyard.clock import Clock
from gpuyard.domain.checkpoint_roots import CheckpointStores
from gpuyard.domain.fleet import Fleet
from gpuyard.secrets.files import FileSecretStore
from gpuyard.settings import Settings
from gpuyard.store.submitter import Submitter
from gpuyard.store.teams import Principal

K = TypeVar("K")
V = TypeVar("V")

TOKEN_TTL_S = 0.5
QUEUE_TTL_S = 10.0
_MISSING = object()


class SingleFlight(Generic[K, V]):
    """Concurrent loads of one key on the event loop share one call (used from the event loop only)."""

    def __init__(self) -> None:
        self._loading: dict[K, asyncio.Future[V]] = {}

    async def run(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        future = self._loading.get(key)
        if future is None:
            future = asyncio.ensure_future(load())
            self._loading[key] = future
            future.add_done_callback(lambda _: self._loading.pop(key, None))
        return await asyncio.shield(future)


class TtlCache(Generic[K, V]):
    """A small thread-safe LRU cache whose entries expire after `ttl_s` (injected `timer`)."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000, timer: Callable[[], float] = time.monotonic):
        self._entries: TTLCache[K, V] = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=timer)
        self._lock = threading.Lock()
        self._flights: SingleFlight[K, V] = SingleFlight()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def peek(self, key: K) -> tuple[bool, V | None]:
        """(found, value) without loading."""
        with self._lock:
            value = self._entries.get(key, _MISSING)
        return (False, None) if value is _MISSING else (True, value)  # type: ignore[return-value]

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value

    def get(self, key: K, load: Callable[[K], V]) -> V:
        found, value = self.peek(key)
        if found:
            return value  # type: ignore[return-value]
        value = load(key)
        self.put(key, value)
        return value

    async def get_async(self, key: K, load: Callable[[K], V]) -> V:
        """get() for the event loop: a hit costs no hop to a worker thread, a miss loads in one."""
        found, value = self.peek(key)
        if found:
            return value  # type: ignore[return-value]
        return await self._flights.run(key, lambda: run_in_threadpool(self.get, key, load))

    def forget(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class Refreshed(Generic[V]):
    """One value kept fresh in the background: the first read loads it; a read after `ttl_s` gets the
    value it has at once and starts one reload in a thread (stale while revalidating), so readers
    never wait for a slow load once there is a value, and the load runs at most once per period."""

    def __init__(self, ttl_s: float, timer: Callable[[], float] = time.monotonic):
        self.ttl_s, self._timer = ttl_s, timer
        self._value: V | None = None
        self._loaded_at = -float("inf")
        self._lock = threading.Lock()  # held by the first load only
        self._flag = threading.Lock()  # guards `_reloading`
        self._reloading = False

    def get(self, load: Callable[[], V]) -> V:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value, self._loaded_at = load(), self._timer()
            return self._value
        if self._timer() - self._loaded_at > self.ttl_s:
            with self._flag:
                start, self._reloading = not self._reloading, True
            if start:
                threading.Thread(target=self._reload, args=(load,), daemon=True, name="refresh").start()
        return self._value

    def _reload(self, load: Callable[[], V]) -> None:
        try:
            self._value, self._loaded_at = load(), self._timer()
        finally:
            self._reloading = False

    def clear(self) -> None:
        self._value = None


class TokenCache:
    """Bearer token -> Principal, with known and unknown tokens kept apart (see the module docstring)."""

    def __init__(
        self,
        ttl_s: float = TOKEN_TTL_S,
        max_known: int = 10_000,
        max_unknown: int = 4_096,
        timer: Callable[[], float] = time.monotonic,
    ):
        self.known: TtlCache[str, Principal] = TtlCache(ttl_s, max_known, timer)
        self.unknown: TtlCache[str, None] = TtlCache(ttl_s, max_unknown, timer)
        self._flights: SingleFlight[str, Principal | None] = SingleFlight()

    def peek(self, token: str) -> tuple[bool, Principal | None]:
        found, principal = self.known.peek(token)
        if found:
            return True, principal
        return self.unknown.peek(token)[0], None

    def resolve(self, token: str, load: Callable[[str], Principal | None]) -> Principal | None:
        found, principal = self.peek(token)
        if found:
            return principal
        principal = load(token)
        if principal is None:
            self.unknown.put(token, None)
        else:
            self.known.put(token, principal)
        return principal

    async def resolve_async(self, token: str, load: Callable[[str], Principal | None]) -> Principal | None:
        found, principal = self.peek(token)
        if found:
            return principal
        return await self._flights.run(token, lambda: run_in_threadpool(self.resolve, token, load))

    def clear(self) -> None:
        self.known.clear()
        self.unknown.clear()


@dataclass
class ApiContext:
    settings: Settings
    engine: Engine
    submitter: Submitter  # the hot path's own way to the store (see store/submitter.py)
    fleet: Fleet
    clock: Clock
    logs: Callable[[str, bool], Iterator[str]] | None = None  # (attempt id, follow) -> lines
    secrets: FileSecretStore | None = None  # None: the teams' secrets are Kubernetes Secrets
    checkpoint_stores: CheckpointStores = field(default_factory=CheckpointStores)  # the teams' roots' stores
    principals: TokenCache = field(default_factory=TokenCache)
    teams: TtlCache = field(default_factory=lambda: TtlCache(ttl_s=5.0))  # name -> store.teams.Team
    # check_feasible by (resources, sites), all it reads: the fleet is fixed for this process, and
    # walking thousands of nodes would cost milliseconds per submit.
    feasibility: TtlCache = field(default_factory=lambda: TtlCache(ttl_s=float("inf")))
    # The platform summary behind /metrics: computed at most once per period, however often scraped.
    scrape_summary: TtlCache = field(default_factory=lambda: TtlCache(ttl_s=30.0, max_entries=1))
    # The queue with the cycle's reasons behind /v1/queue (routes_queue.py): one for every caller.
    queue_view: Refreshed = field(default_factory=lambda: Refreshed(ttl_s=QUEUE_TTL_S))
