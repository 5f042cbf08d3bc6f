"""The outbox relay: everything published at least once, across replicas, crashes and Redis restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
from gpuyard.bus.base import BusUnavailable
from gpuyard.bus.memory import MemoryBus
from gpuyard.bus.redis_streams import RedisStreamsBus
from gpuyard.clock import utcnow
from gpuyard.domain.spec import parse_spec
from gpuyard.relay import Relay, next_wait
from gpuyard.store import jobs as job_store
from gpuyard.store import outbox
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine, migrate
from gpuyard.store.tables import events
from servers import RedisServer, production_settings, wait_until
from sqlalchemy import Engine, func, select, text

from .conftest import EXAMPLE_SPEC


def submit_jobs(engine: Engine, count: int) -> None:
    with engine.begin() as conn:
        team_store.ensure_team(conn, "a", team_store.TeamQuota(), utcnow())
    spec = parse_spec(EXAMPLE_SPEC)
    for _ in range(count):
        job_store.submit(engine, spec, idempotency_key=None, created_by="test", at=utcnow())


def all_seqs(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(select(events.c.seq)).scalars())


def unpublished(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(events.c.published_at.is_(None))).scalar() or 0)


def stream_seqs(url: str, stream: str) -> list[int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return [int(fields["seq"]) for _, fields in client.xrange(stream)]
    finally:
        client.close()


def test_relay_publishes_batches_and_marks_them(engine: Engine) -> None:
    submit_jobs(engine, 7)
    bus = MemoryBus()
    bus.ensure_group("g")
    relay = Relay(engine, bus, batch_size=3)
    assert [relay.run_once() for _ in range(4)] == [3, 3, 1, 0]
    assert unpublished(engine) == 0
    assert {d.message.event_seq for d in bus.read("g", "c", count=100, block_s=0)} == all_seqs(engine)


def test_an_idle_relay_polls_half_as_often_each_time_up_to_its_idle_poll() -> None:
    waits, last = [], 0.05
    for published in (0, 0, 0, 0, 0, 0, 3, 0):
        last = next_wait(last, published, poll_s=0.05, idle_poll_s=1.0)
        waits.append(last)
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 0.05, 0.1]
    assert next_wait(0.05, 0, poll_s=0.05, idle_poll_s=0.01) == 0.05  # never below its poll


def test_a_commit_that_appended_events_wakes_the_relay_of_its_process_at_once(engine: Engine) -> None:
    """The relay waits out a 60 s poll; the job submitted through its engine is published at once, and
    a commit that appended nothing (a team's) does not wake it."""
    bus, stop, wake = MemoryBus(), threading.Event(), threading.Event()
    outbox.on_events_committed(engine, wake.set)
    relay = Relay(engine, bus, wake=wake)
    polls = []
    run_once = relay.run_once
    relay.run_once = lambda: polls.append(run_once()) or polls[-1]  # type: ignore[method-assign]
    thread = threading.Thread(target=relay.run, args=(stop,), kwargs={"poll_s": 60.0, "idle_poll_s": 60.0})
    thread.start()
    try:
        wait_until(lambda: polls == [0], what="the relay's first (empty) poll")
        with engine.begin() as conn:
            team_store.ensure_team(conn, "a", team_store.TeamQuota(), utcnow())
        assert not wake.is_set() and polls == [0]
        submit_jobs(engine, 1)
        # its second poll, woken well before the 60 s one; the poll's count is appended once it returned,
        # after its commit: waiting for the row alone would race that append
        wait_until(lambda: len(polls) >= 2, timeout_s=20, what="the relay's poll woken by the commit")
        assert polls[:2] == [0, 1] and unpublished(engine) == 0
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()  # a stop ends its wait for a wake-up too


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_concurrent_relays_lose_nothing_and_skip_each_others_rows(
    engine: Engine, redis_url: str, redis_stream: str
) -> None:
    stop = threading.Event()
    relays = [
        threading.Thread(
            target=Relay(engine, RedisStreamsBus(redis_url, stream=redis_stream), batch_size=20).run,
            args=(stop,),
            kwargs={"poll_s": 0.01},
        )
        for _ in range(4)
    ]
    for thread in relays:
        thread.start()
    submit_jobs(engine, 300)
    wait_until(lambda: unpublished(engine) == 0, what="all events published")
    stop.set()
    for thread in relays:
        thread.join()
    published = Counter(stream_seqs(redis_url, redis_stream))
    assert set(published) == all_seqs(engine)
    assert max(published.values()) == 1  # SKIP LOCKED: no replica published another's batch


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_relay_killed_between_publish_and_mark_loses_nothing(
    engine: Engine, database_url: str, redis_url: str, redis_stream: str, tmp_path: Path
) -> None:
    submit_jobs(engine, 40)
    env = {**os.environ, **production_settings(database_url, redis_url, redis_stream, tmp_path)}
    command = [sys.executable, "-m", "gpuyard.cli", "relay"]
    # Hold a SHARE lock: the relay can lock rows and publish, but its UPDATE (the mark) must wait.
    with engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE events IN SHARE MODE"))
        relay = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        wait_until(lambda: len(stream_seqs(redis_url, redis_stream)) >= 40, what="the batch published")
        relay.send_signal(signal.SIGKILL)
        relay.wait()
        blocker.rollback()
    assert unpublished(engine) == 40  # published, never marked
    restarted = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: unpublished(engine) == 0, what="the restarted relay to catch up")
    finally:
        restarted.terminate()
        assert restarted.wait(timeout=20) == 0
    published = Counter(stream_seqs(redis_url, redis_stream))
    assert set(published) == all_seqs(engine)
    assert sorted(set(published.values())) == [2]  # every event twice: at-least-once, none lost


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_redis_restart_while_submitting_loses_nothing(engine: Engine, throwaway_redis: RedisServer) -> None:
    stream = f"gpuyard:test:{uuid.uuid4().hex[:8]}"
    received: set[int] = set()
    stop = threading.Event()

    def consume() -> None:
        bus = RedisStreamsBus(throwaway_redis.url, stream=stream)
        while not stop.is_set():
            try:
                bus.ensure_group("scheduler")
                got = bus.read("scheduler", "c1", count=100, block_s=0.1)
                received.update(d.message.event_seq for d in got)
                bus.ack("scheduler", [d.id for d in got])
            except BusUnavailable:
                stop.wait(0.1)

    relay = Relay(engine, RedisStreamsBus(throwaway_redis.url, stream=stream), batch_size=25)
    threads = [
        threading.Thread(target=consume),
        threading.Thread(target=relay.run, args=(stop,), kwargs={"poll_s": 0.02, "max_backoff_s": 0.2}),
    ]
    for thread in threads:
        thread.start()
    try:
        submit_jobs(engine, 30)
        wait_until(lambda: received == all_seqs(engine), what="events before the restart")
        throwaway_redis.stop()
        submit_jobs(engine, 30)  # the outbox holds these while Redis is down
        assert unpublished(engine) == 30
        throwaway_redis.start()
        submit_jobs(engine, 30)
        wait_until(lambda: received == all_seqs(engine), timeout_s=30, what="every event after the restart")
        assert len(received) == 90
    finally:
        stop.set()
        for thread in threads:
            thread.join()


REFUSALS = {
    # A replica refuses writes (a failover pointed the relay at one); a full Redis refuses them too.
    "ReadOnlyError": (["REPLICAOF", "127.0.0.1", "1"], ["REPLICAOF", "NO", "ONE"]),
    "OutOfMemoryError": (["CONFIG", "SET", "maxmemory", "1"], ["CONFIG", "SET", "maxmemory", "0"]),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_relay_outlives_a_redis_that_refuses_writes(
    engine: Engine, throwaway_redis: RedisServer, refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    refuse, accept = REFUSALS[refusal]
    admin = redis.Redis.from_url(throwaway_redis.url)
    stream = f"gpuyard:test:{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    relay = threading.Thread(
        target=Relay(engine, RedisStreamsBus(throwaway_redis.url, stream=stream), batch_size=25).run,
        args=(stop,),
        kwargs={"poll_s": 0.02, "max_backoff_s": 0.2},
    )
    relay.start()
    try:
        submit_jobs(engine, 10)
        wait_until(lambda: unpublished(engine) == 0, what="events before the refusal")
        admin.execute_command(*refuse)
        submit_jobs(engine, 10)
        wait_until(
            lambda: any(refusal in r.getMessage() for r in caplog.records), what=f"the relay to see {refusal}"
        )
        assert relay.is_alive()
        assert unpublished(engine) == 10  # the outbox holds them
        admin.execute_command(*accept)
        wait_until(lambda: unpublished(engine) == 0, what="the relay to publish after the refusal")
        assert set(stream_seqs(throwaway_redis.url, stream)) == all_seqs(engine)
    finally:
        stop.set()
        relay.join()
        admin.close()


@pytest.mark.slow
def test_relay_rejects_the_in_process_bus_as_a_separate_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "relay", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUYARD_BUS": "memory"},
    )
    assert result.returncode == 1
    assert "needs bus=redis" in result.stderr


def test_sqlite_store_is_created_on_first_use(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'deep' / 'x.db'}")
    migrate(engine)
    migrate(engine)  # idempotent
    submit_jobs(engine, 1)
    assert len(all_seqs(engine)) == 1
