"""The in-process bus of the embedded default, with the same at-least-once semantics as Redis Streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuyard.bus.base import Delivery, Message


@dataclass
class _Group:
    cursor: int  # index (in the whole stream's history) of the next message never delivered to the group
    pending: dict[int, tuple[str, float]] = field(default_factory=dict)  # index -> (consumer, delivered at)


class MemoryBus:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._log: list[Message] = []
        self._base = 0  # stream index of self._log[0]; messages every group is done with are dropped
        self._groups: dict[str, _Group] = {}
        self._changed = threading.Condition()

    def publish(self, messages: Sequence[Message]) -> None:
        with self._changed:
            self._log.extend(messages)
            self._changed.notify_all()

    def ensure_group(self, group: str) -> None:
        with self._changed:
            self._groups.setdefault(group, _Group(cursor=self._base))

    def read(self, group: str, consumer: str, *, count: int = 100, block_s: float = 1.0) -> list[Delivery]:
        deadline = self._clock() + block_s
        with self._changed:
            state = self._group(group)
            while state.cursor >= self._base + len(self._log):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return []
                self._changed.wait(remaining)
            end = min(state.cursor + count, self._base + len(self._log))
            now = self._clock()
            deliveries = []
            for index in range(state.cursor, end):
                state.pending[index] = (consumer, now)
                deliveries.append(Delivery(str(index), self._log[index - self._base]))
            state.cursor = end
            return deliveries

    def ack(self, group: str, ids: Sequence[str]) -> None:
        with self._changed:
            state = self._group(group)
            for delivery_id in ids:
                state.pending.pop(int(delivery_id), None)
            self._trim()

    def reclaim(self, group: str, consumer: str, *, min_idle_s: float, count: int = 100) -> list[Delivery]:
        with self._changed:
            state = self._group(group)
            now = self._clock()
            stale = sorted(i for i, (_, at) in state.pending.items() if now - at >= min_idle_s)[:count]
            for index in stale:
                state.pending[index] = (consumer, now)
            return [Delivery(str(i), self._log[i - self._base]) for i in stale]

    def close(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _group(self, group: str) -> _Group:
        try:
            return self._groups[group]
        except KeyError:
            raise KeyError(f"no consumer group {group!r}: call ensure_group first") from None

    def _trim(self) -> None:
        # Drop the prefix every group has read and acked; no group can ask for it again.
        done = min((min([g.cursor, *g.pending]) for g in self._groups.values()), default=self._base)
        if done > self._base:
            del self._log[: done - self._base]
            self._base = done
