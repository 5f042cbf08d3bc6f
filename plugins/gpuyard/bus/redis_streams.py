"""Redis Streams bus: consumer groups, acks, and XAUTOCLAIM to reclaim a dead consumer's messages.

Every call is bounded (docs/faults.md): connecting and each command wait at most `timeout_s`, a
blocking read included (it must block for less), and a failed command is retried once, at once,
only when its connection was broken (a pooled connection that a Redis restart closed); callers
retry later themselves. Any Redis error, including a refused write (READONLY on a
replica, OOM under `maxmemory`), is `BusUnavailable`: the outbox keeps the events meanwhile.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from gpuyard.bus.base import BusUnavailable, Delivery, Message
from gpuyard.settings import BUS_TIMEOUT_S

STREAM = "gpuyard:events"
# Messages are hints (the database is the truth), so an approximate cap only bounds memory.
MAX_LENGTH = 1_000_000


class RedisStreamsBus:
    def __init__(self, url: str, stream: str = STREAM, *, timeout_s: float = BUS_TIMEOUT_S):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s}")
        self.timeout_s, self.stream = timeout_s, stream
        keepalive = max(1, round(timeout_s))
        self._redis = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_keepalive=True,
            socket_keepalive_options={
                socket.TCP_KEEPIDLE: keepalive,
                socket.TCP_KEEPINTVL: max(1, keepalive // 3),
                socket.TCP_KEEPCNT: 3,
            },
            health_check_interval=max(1, round(timeout_s)),
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        )

    def publish(self, messages: Sequence[Message]) -> None:
        with _unavailable_as_error():
            pipe = self._redis.pipeline(transaction=False)
            for message in messages:
                pipe.xadd(self.stream, message.encode(), maxlen=MAX_LENGTH, approximate=True)  # type: ignore[arg-type]
            pipe.execute()

    def ensure_group(self, group: str) -> None:
        with _unavailable_as_error():
            try:
                self._redis.xgroup_create(self.stream, group, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    raise

    def read(self, group: str, consumer: str, *, count: int = 100, block_s: float = 1.0) -> list[Delivery]:
        if block_s >= self.timeout_s:
            raise ValueError(f"block_s: a read must block less than the bus timeout ({self.timeout_s:g}s)")
        reply = self._with_group(
            group,
            lambda: self._redis.xreadgroup(
                group, consumer, {self.stream: ">"}, count=count, block=max(1, int(block_s * 1000))
            ),
        )
        return [d for _, entries in reply or [] for d in _deliveries(entries)]

    def ack(self, group: str, ids: Sequence[str]) -> None:
        if ids:
            with _unavailable_as_error():
                self._redis.xack(self.stream, group, *ids)

    def reclaim(self, group: str, consumer: str, *, min_idle_s: float, count: int = 100) -> list[Delivery]:
        reply = self._with_group(
            group,
            lambda: self._redis.xautoclaim(
                self.stream,
                group,
                consumer,
                min_idle_time=int(min_idle_s * 1000),
                start_id="0-0",
                count=count,
            ),
        )
        return _deliveries(reply[1]) if reply else []

    def close(self) -> None:
        self._redis.close()

    def _with_group(self, group: str, call: Any) -> Any:
        """Run a group command; if Redis lost the group (a restart without persistence), recreate it."""
        with _unavailable_as_error():
            try:
                return call()
            except ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
            self.ensure_group(group)
            return call()


@contextmanager
def _unavailable_as_error() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as error:
        raise BusUnavailable(f"Redis: {type(error).__name__}: {error}") from error


def _deliveries(entries: Any) -> list[Delivery]:
    # XAUTOCLAIM lists deleted entries as (id, None)
    return [Delivery(entry_id, Message.decode(fields)) for entry_id, fields in entries if fields]
