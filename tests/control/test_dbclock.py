"""The database's clock: a process whose own clock is skewed still tells the database's time, so the
leases it writes and the ones it reaps agree with every other process (the review's 60 s of skew
reaped healthy attempts, and 30 s stole leadership every pass)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from gpuyard.store.db import make_engine
from gpuyard.store.dbclock import DatabaseClock
from sqlalchemy import func, select

pytestmark = pytest.mark.postgres

TELL = """
import json, sys
from datetime import UTC, datetime
from gpuyard.store.db import make_engine
from gpuyard.store.dbclock import DatabaseClock
clock = DatabaseClock(make_engine(sys.argv[1], pool_size=1))
print(json.dumps({"own": datetime.now(UTC).timestamp(), "database": clock().timestamp()}))
"""

# A scheduler as `gpuyard scheduler` builds it: its launcher's reports (an attempt's start, its end)
# are recorded as stamped, so they must carry the database's time too.
TELL_REPORTS = """
import json, sys
from datetime import UTC, datetime
from gpuyard.services import build_scheduler
from gpuyard.store.db import open_engine
from gpuyard.settings import load_settings
settings = load_settings(home=sys.argv[2], database_url=sys.argv[1], launcher="local")
engine = open_engine(settings, 1)
service = build_scheduler(settings, engine, lambda: None, lambda: "http://127.0.0.1:9")
print(json.dumps({"own": datetime.now(UTC).timestamp(), "database": service.launcher.clock().timestamp()}))
"""


def database_now(url: str) -> float:
    engine = make_engine(url, pool_size=1)
    with engine.connect() as conn:
        now: datetime = conn.execute(select(func.clock_timestamp())).scalar_one()
    engine.dispose()
    return now.timestamp()


def told_under_skew(url: str, skew: str, program: str, *args: str) -> tuple[float, dict[str, float], float]:
    """Run `program` with this machine's wall clock skewed by `skew` (libfaketime; the monotonic clock
    left alone); what it printed, between the database's time before it started and after it ended."""
    started = database_now(url)
    told = subprocess.run(
        ["faketime", "-f", skew, sys.executable, "-c", program, *args],
        env={**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return started, json.loads(told.stdout), database_now(url)


@pytest.mark.parametrize("skew", ["+60s", "-30s"])
def test_a_process_with_a_skewed_clock_tells_the_databases_time(postgres_url: str, skew: str) -> None:
    """Its database clock lies between the database's time before it started and after it ended (a
    loaded machine takes seconds to start and end a process; the skew is a minute)."""
    started, seen, ended = told_under_skew(postgres_url, skew, TELL, postgres_url)
    assert started - 5 < seen["own"] - float(skew.rstrip("s")) < ended + 5  # its own clock is skewed
    assert started - 0.5 <= seen["database"] <= ended + 0.5  # its database clock is not


def test_a_scheduler_with_a_skewed_clock_stamps_its_launchers_reports_with_the_databases_time(
    postgres_url: str, tmp_path: Path
) -> None:
    """Issue 28's 60-minute run, seed 744: a scheduler 7 s fast recorded an attempt's start (its
    launcher's report, stamped by the wall clock) after the attempt's end (the database's clock),
    and the attempt's lost progress came out as 0 s."""
    started, seen, ended = told_under_skew(postgres_url, "+60s", TELL_REPORTS, postgres_url, str(tmp_path))
    assert seen["own"] - 60 > started - 5  # its own clock is skewed
    assert started - 0.5 <= seen["database"] <= ended + 0.5  # its launcher's is the database's


def test_the_database_clock_counts_on_between_syncs_with_the_monotonic_clock(postgres_url: str) -> None:
    ticks = iter([100.0] * 4 + [160.0] * 2)  # the first call syncs: check, send, receive, read
    engine = make_engine(postgres_url, pool_size=1)
    clock = DatabaseClock(engine, resync_s=3600, monotonic=lambda: next(ticks))
    first = clock()
    assert abs(first.timestamp() - datetime.now(UTC).timestamp()) < 1.0
    assert (clock() - first).total_seconds() == pytest.approx(60.0)  # no resync: counted on
    engine.dispose()


def test_a_sync_whose_round_trip_was_slow_is_not_taken(postgres_url: str) -> None:
    """Fault campaign seed 1122: a resync while the database's link was black-holed took 10 s; its
    reading, taken as the middle of the round trip, put an API's clock 4.9 s ahead until the next
    resync, and the checkpoints it recorded were charged 4.9 s too little lost progress. A slow
    reading is not taken: the clock counts on from the last good one."""
    ticks = iter([0.0, 0.01, 0.01, 40.0, 40.0, 50.0, 50.0])  # each monotonic reading the clock makes
    clock = DatabaseClock(
        make_engine(postgres_url, pool_size=1), resync_s=30.0, monotonic=lambda: next(ticks)
    )
    first = clock().timestamp()  # synced in 0.01 s
    later = clock().timestamp()  # due to resync at 40 s; the reading takes 10 s
    assert later - first == pytest.approx(50.0 - 0.01, abs=0.01)  # counted on from the first reading
