"""Logging of the control plane: one set-up for every server process, level and format from settings.

The review found the scheduler's and relay's INFO lines lost: nothing configured logging. The format
is checked in-process; the wiring over real `gpuyard up` and `gpuyard relay` processes.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuyard.observability import logs
from servers import GpuyardUp, production_settings, wait_until, without_gpuyard_settings
from sqlalchemy import Engine

from .test_relay import submit_jobs, unpublished

TOKEN = "gy_0123456789abcdef_S3cr3t-Token_Value"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    yield out
    logs.configure("WARNING", "text", stream=sys.stderr)


def test_text_lines_are_key_value_pairs_with_the_callers_fields(stream: io.StringIO) -> None:
    logs.configure("INFO", "text", stream=stream)
    logging.getLogger("gpuyard.test").info(
        "attempt %s placed", "att-1", extra={"job_id": "job-9", "attempt_id": "att-1"}
    )
    logging.getLogger("gpuyard.test").debug("not at INFO")
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("ts=20") and line.split(" ", 1)[1] == (
        'level=INFO logger=gpuyard.test msg="attempt att-1 placed" job_id=job-9 attempt_id=att-1'
    )


def test_json_lines_keep_a_traceback_on_the_line_and_never_a_token(stream: io.StringIO) -> None:
    logs.configure("INFO", "json", stream=stream)
    try:
        raise RuntimeError(f"refused {TOKEN}")
    except RuntimeError:
        logging.getLogger("gpuyard.api").exception("request with %s failed", TOKEN, extra={"auth": TOKEN})
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert (record["level"], record["logger"], record["msg"]) == (
        "ERROR",
        "gpuyard.api",
        "request with gy_*** failed",
    )
    assert record["auth"] == "gy_***" and "RuntimeError: refused gy_***" in record["exc"]
    assert "S3cr3t" not in line


def test_a_bad_level_or_format_is_named() -> None:
    with pytest.raises(ValueError, match="log_format: expected one of"):
        logs.configure("INFO", "xml")


def gpuyard(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines()


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


def info_lines(log: Path, logger: str, message: str) -> list[str]:
    return [x for x in lines(log) if f"level=INFO logger={logger} " in x and message in x]


@pytest.mark.slow
def test_gpuyard_up_logs_the_relays_and_the_schedulers_info_lines(tmp_path: Path) -> None:
    up = GpuyardUp(tmp_path / "home", without_gpuyard_settings(GPUYARD_LOG_FORMAT="text"))
    try:
        up.start(timeout_s=90)
        wait_until(
            lambda: (
                info_lines(up.log, "gpuyard.relay", 'msg="relay started')
                and info_lines(up.log, "gpuyard.scheduler.service", " leads (epoch")
            ),
            timeout_s=90,
            what=f"the relay's and the scheduler's INFO lines in {up.log}",
        )
    finally:
        up.stop()


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_production_relay_writes_json_lines_at_the_level_set(
    engine: Engine, database_url: str, redis_url: str, redis_stream: str, tmp_path: Path
) -> None:
    log = tmp_path / "relay.log"
    # the probe on any free port: another relay on this machine may hold 9102
    env = production_settings(database_url, redis_url, redis_stream, tmp_path, GPUYARD_RELAY_PROBE_PORT="0")
    relay = gpuyard(["relay"], log, **env)
    try:
        wait_until(lambda: any("relay started" in x for x in lines(log)), timeout_s=60, what="relay started")
    finally:
        stop(relay)
    records = [json.loads(line) for line in lines(log)]  # every line is one JSON object
    messages = {(r["level"], r["logger"], r["msg"].split(":")[0]) for r in records}
    assert ("INFO", "gpuyard.relay", "relay started") in messages
    assert ("INFO", "gpuyard.cli", "relay") in messages  # "relay: publishing <url> -> stream ..."

    # At WARNING the same relay publishes and says nothing.
    submit_jobs(engine, 3)
    quiet = gpuyard(["relay"], tmp_path / "quiet.log", **env, GPUYARD_LOG_LEVEL="WARNING")
    try:
        wait_until(lambda: unpublished(engine) == 0, timeout_s=60, what="the quiet relay to publish")
    finally:
        stop(quiet)
    assert quiet.returncode == 0 and lines(tmp_path / "quiet.log") == []


def test_every_line_a_request_causes_carries_its_request_id(stream: io.StringIO, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from gpuyard.api.app import create_app
    from gpuyard.settings import load_settings
    from gpuyard.store.db import make_engine

    settings = load_settings(home=tmp_path, database_url="postgresql://gpuyard@127.0.0.1:1/none")
    engine = make_engine(str(settings.database_url), pool_size=1)  # nothing listens: every query fails
    logs.configure("INFO", "json", stream=stream)
    with TestClient(create_app(settings, engine)) as client:
        given = client.get("/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}", "X-Request-Id": "req-42"})
        made = client.get("/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}", "X-Request-Id": "bad id!"})
    assert (given.status_code, given.headers["x-request-id"]) == (503, "req-42")
    assert made.status_code == 503 and re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    unavailable = [
        r for r in map(json.loads, stream.getvalue().splitlines()) if "database unavailable" in r["msg"]
    ]
    assert [r["request_id"] for r in unavailable] == ["req-42", made.headers["x-request-id"]]
    assert TOKEN.split("_")[2] not in stream.getvalue()
