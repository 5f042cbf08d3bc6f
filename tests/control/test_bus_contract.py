"""One contract, two buses: the in-process bus must behave like Redis Streams (at-least-once);
and the Redis bus's bounds: every call ends within its timeout, every refusal is BusUnavailable."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from faults.proxy import FaultProxy
from gpuyard.bus.base import BusUnavailable, EventBus, Message
from gpuyard.bus.memory import MemoryBus
from gpuyard.bus.redis_streams import RedisStreamsBus
from servers import RedisServer


@pytest.fixture(params=["memory", "redis"])
def bus(request: pytest.FixtureRequest) -> Iterator[EventBus]:
    if request.param == "memory":
        made: EventBus = MemoryBus()
    else:
        made = RedisStreamsBus(
            request.getfixturevalue("redis_url"), stream=request.getfixturevalue("redis_stream")
        )
    yield made
    made.close()


def messages(n: int, start: int = 1) -> list[Message]:
    return [
        Message(event_seq=i, type="job.submitted", job_id=f"job-{i}", data={"i": i})
        for i in range(start, start + n)
    ]


def test_every_group_gets_every_message_in_order(bus: EventBus) -> None:
    bus.ensure_group("scheduler")
    bus.ensure_group("metrics")
    bus.publish(messages(5))
    for group in ("scheduler", "metrics"):
        got = bus.read(group, "c1", count=10, block_s=0.5)
        assert [d.message for d in got] == messages(5)
        bus.ack(group, [d.id for d in got])
        assert bus.read(group, "c1", block_s=0.05) == []


def test_consumers_of_one_group_share_the_work(bus: EventBus) -> None:
    bus.ensure_group("g")
    bus.publish(messages(6))
    first = bus.read("g", "c1", count=3, block_s=0.5)
    second = bus.read("g", "c2", count=10, block_s=0.5)
    assert [d.message.event_seq for d in first + second] == [1, 2, 3, 4, 5, 6]


def test_a_group_created_late_still_sees_retained_messages(bus: EventBus) -> None:
    bus.ensure_group("early")
    bus.publish(messages(2))
    bus.ensure_group("late")
    assert [d.message.event_seq for d in bus.read("late", "c", block_s=0.5)] == [1, 2]


def test_unacked_messages_of_a_dead_consumer_are_reclaimed(bus: EventBus) -> None:
    bus.ensure_group("g")
    bus.publish(messages(3))
    held = bus.read("g", "dies", count=3, block_s=0.5)
    bus.ack("g", [held[0].id])  # processed one, then died
    assert bus.reclaim("g", "survivor", min_idle_s=60) == []  # not idle long enough yet
    time.sleep(0.15)
    reclaimed = bus.reclaim("g", "survivor", min_idle_s=0.1)
    assert [d.message.event_seq for d in reclaimed] == [2, 3]
    bus.ack("g", [d.id for d in reclaimed])
    time.sleep(0.15)
    assert bus.reclaim("g", "other", min_idle_s=0.1) == []


def test_read_blocks_until_a_message_arrives(bus: EventBus) -> None:
    bus.ensure_group("g")
    timer = threading.Timer(0.2, lambda: bus.publish(messages(1)))
    timer.start()
    started = time.monotonic()
    got = bus.read("g", "c", block_s=3)
    assert [d.message.event_seq for d in got] == [1]
    assert time.monotonic() - started < 2.5
    timer.join()


def test_duplicates_are_delivered_as_published(bus: EventBus) -> None:
    # At-least-once: the relay may publish an event twice; consumers see both and dedupe by seq.
    bus.ensure_group("g")
    bus.publish(messages(1) + messages(1))
    assert [d.message.event_seq for d in bus.read("g", "c", block_s=0.5)] == [1, 1]


def test_message_round_trips_fields(bus: EventBus) -> None:
    bus.ensure_group("g")
    sent = Message(
        event_seq=7, type="attempt.lost", job_id="job-1", attempt_id="att-2", data={"nested": {"x": [1]}}
    )
    bus.publish([sent])
    assert bus.read("g", "c", block_s=0.5)[0].message == sent


def test_reading_an_unknown_group_is_an_error_or_recreates_it(bus: EventBus) -> None:
    if isinstance(bus, MemoryBus):
        with pytest.raises(KeyError, match="ensure_group"):
            bus.read("nope", "c", block_s=0)
    else:  # Redis loses groups on restart without persistence: the bus recreates them
        bus.publish(messages(1))
        assert [d.message.event_seq for d in bus.read("nope", "c", block_s=0.2)] == [1]


def test_memory_bus_drops_what_every_group_acked() -> None:
    bus = MemoryBus()
    bus.ensure_group("a")
    bus.ensure_group("b")
    bus.publish(messages(4))
    for group in ("a", "b"):
        got = bus.read(group, "c", count=2, block_s=0)
        bus.ack(group, [d.id for d in got])
    assert len(bus._log) == 2  # the first two are gone, the rest still owed
    assert [d.message.event_seq for d in bus.read("a", "c", block_s=0)] == [3, 4]


# -- Redis only: every call bounded, every refusal a BusUnavailable (docs/faults.md) ------------------


def test_a_black_holed_redis_fails_each_call_within_the_bus_timeout(throwaway_redis: RedisServer) -> None:
    proxy = FaultProxy("127.0.0.1", throwaway_redis.port).start()
    bus = RedisStreamsBus(f"redis://127.0.0.1:{proxy.port}/0", stream="s", timeout_s=1.0)
    bus.ensure_group("g")
    proxy.set("blackhole")
    for call in (
        lambda: bus.publish(messages(1)),
        lambda: bus.read("g", "c", block_s=0.5),
        lambda: bus.ack("g", ["0-1"]),
    ):
        started = time.monotonic()
        with pytest.raises(BusUnavailable, match="Timeout"):
            call()
        assert time.monotonic() - started < 2.5  # one timeout: no hidden retries behind it
    proxy.heal()  # what the black hole held is delivered now: the timed-out publish may land too
    bus.ensure_group("after")
    bus.publish(messages(1, start=2))
    assert {d.message.event_seq for d in bus.read("after", "c", block_s=0.5)} in ({2}, {1, 2})
    bus.close()
    proxy.stop()


def test_a_redis_that_refuses_writes_is_unavailable(throwaway_redis: RedisServer) -> None:
    bus = RedisStreamsBus(throwaway_redis.url, stream="s", timeout_s=1.0)
    admin = redis.Redis.from_url(throwaway_redis.url)
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")
    try:
        with pytest.raises(BusUnavailable, match="ReadOnlyError"):
            bus.publish(messages(1))
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()
        bus.close()


def test_a_read_must_block_less_than_the_bus_timeout(redis_url: str) -> None:
    bus = RedisStreamsBus(redis_url, stream="s", timeout_s=1.0)
    with pytest.raises(ValueError, match="block_s"):
        bus.read("g", "c", block_s=1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        RedisStreamsBus(redis_url, timeout_s=0)
