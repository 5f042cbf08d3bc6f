"""The servers a production control plane needs beside its cluster, on one machine: PostgreSQL and
Redis (the machine's own when they answer, else throwaway ones from local binaries) and an S3 endpoint
(moto's server). `make demo-production` and the tests start them the same way.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from urllib.parse import urlsplit

MACHINE_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
MACHINE_REDIS = "redis://127.0.0.1:6379/0"


# Ports for servers are drawn from here up to the kernel's ephemeral range. A port from bind(0) is an
# ephemeral one, and every outgoing connection takes its local port from the same range: one chosen
# there may be taken by the time its server binds it, seconds or minutes later (Airflow's API server
# starts half a minute after its port is chosen; the suite opens thousands of connections meanwhile).
SERVER_PORTS_FROM = 20000
_draw = random.SystemRandom()  # never the seeded module generator: each process its own draws


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host` now, below the ephemeral range where there is room."""
    ceiling = _ephemeral_floor()
    for _ in range(200):
        port = _draw.randrange(SERVER_PORTS_FROM, ceiling) if ceiling > SERVER_PORTS_FROM + 1000 else 0
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind((host, port))
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port on {host} from {SERVER_PORTS_FROM} to {ceiling} after 200 draws")


def answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _wait_for(host: str, port: int, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not answers(host, port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer on {host}:{port} within {timeout_s:g}s")
        time.sleep(0.05)


@contextlib.contextmanager
def throwaway_postgres(directory: Path) -> Iterator[str]:
    """A PostgreSQL cluster of its own under `directory` (initdb, pg_ctl; as the `postgres` user when
    run as root, which they refuse); the URL of its administrative database."""
    initdb = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if initdb is None:
        raise RuntimeError("no PostgreSQL answers and initdb is not installed (apt-get install postgresql)")
    bindir = Path(initdb).parent
    port = free_port()
    data = directory / "pgdata"
    run_as: list[str] = []
    if os.geteuid() == 0:
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(directory, "postgres")
    subprocess.run(
        [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
    pg_ctl = [*run_as, str(bindir / "pg_ctl"), "-D", str(data)]
    subprocess.run(
        [*pg_ctl, "-w", "-l", str(directory / "pg.log"), "start", "-o", options],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*pg_ctl, "stop"], check=False, capture_output=True)


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
            raise RuntimeError(
                "no Redis answers and redis-server is not installed (apt-get install redis-server)"
            )
        options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for("127.0.0.1", self.port, "redis-server")
        return self

    def stop(self) -> None:
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextlib.contextmanager
def throwaway_redis(directory: Path) -> Iterator[str]:
    server = RedisServer(directory).start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def throwaway_database(server_url: str, prefix: str) -> Iterator[str]:
    """The URL of a new, empty database on the PostgreSQL server of `server_url`, dropped afterwards
    (a run stopped half way leaves nothing that could write into the next one's)."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def running_or_throwaway(
    url: str, throwaway: Callable[[Path], ContextManager[str]], directory: Path
) -> Iterator[str]:
    """`url` when a server answers at its address, else a throwaway one's (its files in `directory`)."""
    where = urlsplit(url)
    if answers(where.hostname or "127.0.0.1", where.port or 0):
        yield url
        return
    directory.mkdir(parents=True, exist_ok=True)
    with throwaway(directory) as started:
        yield started


class S3Server:
    """An S3 endpoint: moto's server in a process of its own, reached over HTTP by whoever has `env`
    (fsspec's s3fs, boto3, MLflow, a worker). Every bucket is empty at start; nothing is kept."""

    CREDENTIALS = {"AWS_ACCESS_KEY_ID": "gpuyard-local", "AWS_SECRET_ACCESS_KEY": "gpuyard-local"}

    def __init__(self, port: int | None = None, host: str = "127.0.0.1"):
        """`host`: where it listens (an emulated cluster's gateway, for its pods)."""
        self.host, self.port = host, port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client of this endpoint needs in its environment; its requests retried (botocore
        reads these), since one server process on a loaded machine may answer late."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "10",
            "AWS_RETRY_MODE": "standard",
            **self.CREDENTIALS,
        }

    def start(self) -> S3Server:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for(self.host, self.port, "moto's S3 server")
        return self

    def create_bucket(self, name: str) -> str:
        """A new bucket; its s3:// URL."""
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=self.CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process = None
