"""The client's outage policy as pure rules: what is tried again, how long it waits (backoff, never
sooner than Retry-After, never past the deadline), and a log's read position, which the client
counts and the API skips, whatever order a gang's ranks come in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
import tenacity
from gpuyard.api.log_position import after_offset, whole_lines
from gpuyard_client import (
    Away,
    BackoffOrRetryAfter,
    NotConfigured,
    log_line_rank,
    log_offset,
    outage_s,
    parse_log_offset,
    repeatable,
    retry_after_s,
    worth_retrying,
)

REQUEST = httpx.Request("GET", "http://api/v1/jobs")


def answer(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=REQUEST)


@pytest.mark.parametrize(
    ("method", "headers", "expected"),
    [
        ("GET", None, True),
        ("PUT", None, True),
        ("DELETE", None, True),
        ("POST", None, False),
        ("POST", {"Idempotency-Key": "k"}, True),
    ],
)
def test_what_may_run_twice(method: str, headers: dict[str, str] | None, expected: bool) -> None:
    assert repeatable(method, headers) is expected


@pytest.mark.parametrize(
    ("error", "if_repeatable", "if_not"),
    [
        (httpx.ConnectError("refused"), True, True),  # never reached the server
        (httpx.ConnectTimeout("slow"), True, True),
        (Away(answer(503)), True, True),  # the API acted on nothing
        (Away(answer(429)), True, True),
        (Away(answer(502)), True, False),  # a proxy's: the API may have acted
        (Away(answer(504)), True, False),
        (httpx.ReadError("reset"), True, False),
        (httpx.ReadTimeout("hung"), True, False),
        (httpx.RemoteProtocolError("cut short"), True, False),
        (httpx.UnsupportedProtocol("ftp://"), False, False),  # a bad URL is no outage
        (ValueError("a bug"), False, False),
    ],
)
def test_what_is_an_outage_worth_retrying(error: BaseException, if_repeatable: bool, if_not: bool) -> None:
    assert worth_retrying(error, True) is if_repeatable
    assert worth_retrying(error, False) is if_not


def test_retry_after_in_seconds_or_as_a_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_s(answer(503, **{"Retry-After": "7"})) == 7
    assert (
        retry_after_s(answer(503, **{"Retry-After": format_datetime(now + timedelta(seconds=9))}), now) == 9
    )
    assert retry_after_s(answer(503, **{"Retry-After": "soon"})) == 0
    assert retry_after_s(answer(503)) == 0


def state_after(error: BaseException, attempt: int, since_start_s: float) -> tenacity.RetryCallState:
    state = tenacity.RetryCallState(tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(error), error, None))
    # from 0, not the monotonic clock's now: (now + 60) - now is not 60 once now is large
    state.start_time, state.outcome_timestamp = 0.0, since_start_s
    return state


def test_the_wait_is_backoff_but_never_sooner_than_retry_after_nor_past_the_deadline() -> None:
    wait = BackoffOrRetryAfter(deadline_s=60, max_backoff_s=5)
    backoffs = [wait(state_after(httpx.ConnectError("x"), attempt, 1)) for attempt in range(1, 12)]
    assert all(0 <= b <= 5 for b in backoffs)  # full jitter, capped
    assert wait(state_after(Away(answer(503, **{"Retry-After": "12"})), 1, 1)) == 12
    assert wait(state_after(Away(answer(503, **{"Retry-After": "12"})), 1, 55)) == 5  # 5 s are left
    assert wait(state_after(httpx.ConnectError("x"), 9, 60)) == 0


def test_the_deadline_is_checked_by_name() -> None:
    assert outage_s(2.5) == 2.5
    with pytest.raises(NotConfigured, match="the retry deadline: expected seconds from 0 to 604800, got -1"):
        outage_s(-1)


GANG_LOG = ["[rank0] a\n", "[rank1] b\n", "[rank0] c\n", "[rank1] d\n", "[rank1] e\n", "[rank0] f\n"]


def test_a_read_position_skips_exactly_what_was_read_in_any_interleaving() -> None:
    read: dict[str, int] = {}
    for line in GANG_LOG[:4]:  # the client read these, then the stream broke
        read[log_line_rank(line)] = read.get(log_line_rank(line), 0) + 1
    assert log_offset(read) == "0:2,1:2" and parse_log_offset(log_offset(read)) == read
    again = ["[rank0] a\n", "[rank0] c\n", "[rank0] f\n", "[rank1] b\n", "[rank1] d\n", "[rank1] e\n"]
    assert list(after_offset(again, read)) == ["[rank0] f\n", "[rank1] e\n"]


def test_lines_end_where_the_clients_reader_ends_them() -> None:
    chunks = ["one\r", "\ntwo\rthr", "ee", "\nunended"]
    assert list(whole_lines(chunks)) == ["one\r\n", "two\r", "three\n", "unended"]
    assert [line.rstrip("\r\n") for line in whole_lines(chunks)] == "".join(chunks).splitlines()
    assert list(after_offset(chunks, {"": 2})) == ["three\n", "unended"]
    assert list(after_offset(chunks, {})) == chunks  # a first read passes through as it comes


def test_a_malformed_offset_is_refused_naming_the_form() -> None:
    assert parse_log_offset(":12") == {"": 12}
    with pytest.raises(ValueError, match=r"offset: expected RANK:LINES,\.\.\. \(e\.g\. 0:12,1:7, or :12\)"):
        parse_log_offset("rank0=12")
