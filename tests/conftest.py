"""Shared fixtures: real PostgreSQL and Redis servers.

The machine's servers are used when they answer (127.0.0.1:5432 and :6379, or the URLs in
GPUYARD_TEST_POSTGRES_URL / GPUYARD_TEST_REDIS_URL); otherwise throwaway ones are started from
local binaries for the session, so the suite runs on any machine with PostgreSQL and Redis installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def wait_until(predicate, timeout_s: float = 20.0, interval_s: float = 0.05, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class RedisServer:
    """A throwaway redis-server on a free port, no persistence (like the machine's)."""

    def __init__(self, directory: Path, port: int | None = None):
        self.directory, self.port = directory, port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("no Redis answers and redis-server is not installed (apt-get install redis-server)")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: answers("127.0.0.1", self.port), what=f"redis-server on {self.port}")
        return self

    def stop(self) -> None:
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process = None


def _start_postgres(directory: Path) -> str:
    initdb = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if initdb is None:
        pytest.fail("no PostgreSQL answers and initdb is not installed (apt-get install postgresql)")
    bindir = Path(initdb).parent
    port = free_port()
    data = directory / "pgdata"
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(directory, "postgres")
    subprocess.run(
        [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *run_as,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(directory / "pg.log"),
            "start",
            "-o",
            f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
        ],
        check=True,
        capture_output=True,
    )
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an administrative database on a running PostgreSQL server."""
    url = os.environ.get("GPUYARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    if answers("127.0.0.1", 5432) or "GPUYARD_TEST_POSTGRES_URL" in os.environ:
        yield url
        return
    directory = tmp_path_factory.mktemp("postgres")
    yield _start_postgres(directory)
    subprocess.run(
        ["runuser", "-u", "postgres", "--", "pg_ctl", "-D", str(directory / "pgdata"), "stop"],
        check=False,
        capture_output=True,
    )


@pytest.fixture(scope="session")
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A database of its own for this test session, dropped at the end."""
    name = f"gpuyard_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("GPUYARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if answers("127.0.0.1", 6379) or "GPUYARD_TEST_REDIS_URL" in os.environ:
        yield url
        return
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, which the test may kill and restart."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def redis_stream(redis_url: str) -> Iterator[str]:
    """A stream name no other test uses; deleted afterwards."""
    name = f"gpuyard:test:{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(name)
    client.close()
