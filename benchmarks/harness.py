"""What the benchmarks that run gpuyard's own processes share: the servers on their command line,
progress lines, a free port, a fresh database, and waiting for the API to answer. The scripts beside
it import it (`python benchmarks/X.py` puts this folder first on the path)."""

from __future__ import annotations

import argparse
import socket
import sys
import time

import httpx
import psycopg


def servers_parser(description: str) -> argparse.ArgumentParser:
    """A benchmark's command line, starting with the PostgreSQL and Redis servers gpuyard runs on."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test", help="admin URL")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    return parser


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def recreate_database(admin_url: str, name: str) -> str:
    """Database `name` dropped (whoever is connected) and created empty on the server of `admin_url`;
    returns its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def wait_ready(base: str, timeout_s: float = 60.0) -> None:
    """Returns once the API at `base` answers /readyz with 200; exits the benchmark after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("gpuyard api did not become ready")
        time.sleep(0.2)
