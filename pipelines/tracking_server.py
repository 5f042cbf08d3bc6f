"""The embedded profile's MLflow tracking server: `mlflow server` on a pipeline's data root.

A pipeline's store is shared by its jobs (the DAG run's parent run, the registry, the champion
alias), so it is not a file team users write (docs/security.md): the platform runs this server as
its own process, and the pipeline's tasks and its training jobs log to `url` over HTTP. Runs and the
registry are `sqlite:///<root>/mlflow.db`; the artifacts live in `<root>/mlartifacts`, served by the
server (`--serve-artifacts`: experiments it creates get `mlflow-artifacts:` locations, and clients
upload and download through it). Production runs the same server on PostgreSQL and an object store
(deploy/mlflow.yaml). `make demo`, `make ui` and the Airflow tests start one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

MLFLOW = Path(sys.executable).parent / "mlflow"


def command(root: Path, port: int) -> list[str]:
    """`mlflow server` on `root`'s store and artifacts, on 127.0.0.1:`port`, one worker (SQLite)."""
    return [
        str(MLFLOW),
        "server",
        "--host=127.0.0.1",
        f"--port={port}",
        "--workers=1",
        f"--backend-store-uri=sqlite:///{root / 'mlflow.db'}",
        f"--artifacts-destination={(root / 'mlartifacts').as_uri()}",
        "--serve-artifacts",
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TrackingServer:
    """The server of the data root `root` (a local directory), its output in `log`."""

    def __init__(self, root: Path, log: Path, env: Mapping[str, str] | None = None) -> None:
        self.root, self.log, self.env = root, log, env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> TrackingServer:
        """Start it and return once it answers /health (its first start creates the schema)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command(self.root, self.port),
                env=None if self.env is None else dict(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the MLflow tracking server on {self.root} did not start; see {self.log}")
            time.sleep(0.2)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """SIGTERM to its process group (`mlflow server` runs uvicorn as a child), SIGKILL after 30 s."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> TrackingServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
