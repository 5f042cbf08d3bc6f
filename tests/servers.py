"""Real servers and waiting, for tests: free ports, a throwaway Redis, `gpuyard up`, polling with a
deadline."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from local_cluster.services import RedisServer, S3Server, answers, free_port

__all__ = ["RedisServer", "S3Server", "answers", "free_port"]  # the tests' names for the machine's servers


SLOWEST_POLL_S = 0.2  # wait_until's longest pause between two polls (unless asked for longer)


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
    what: str = "condition",
) -> Any:
    """The predicate's first truthy answer. Asked every `interval_s` at first, each pause then half as long
    again as the one before, up to `SLOWEST_POLL_S` (or `interval_s` if longer): a long wait polling an API
    twenty times a second spent a share of a core the suite's other tests needed."""
    deadline = time.monotonic() + timeout_s
    slowest = max(interval_s, SLOWEST_POLL_S)
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(interval_s)
        interval_s = min(interval_s * 1.5, slowest)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@contextlib.contextmanager
def open_directory(prefix: str = "gpuyard-open-") -> Iterator[Path]:
    """A directory every user can enter and write (mode 1777, like /tmp), for what a test hands a job of
    the local launcher: its workers may run as their team's user (worker_users), who cannot enter
    pytest's tmp_path (under /tmp/pytest-of-<user>, mode 0700). Removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    directory.chmod(0o1777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def without_gpuyard_settings(**extra: str) -> dict[str, str]:
    """This process's environment less its GPUYARD_* settings (a server or CLI of the test's own), plus
    `extra`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")} | extra


def production_settings(
    database_url: str, redis_url: str, redis_stream: str, home: Path, **extra: str
) -> dict[str, str]:
    """The GPUYARD_* settings of a production-profile server process: its PostgreSQL, its Redis stream
    and its home, plus `extra`."""
    return {
        "GPUYARD_PROFILE": "production",
        "GPUYARD_DATABASE_URL": database_url,
        "GPUYARD_REDIS_URL": redis_url,
        "GPUYARD_REDIS_STREAM": redis_stream,
        "GPUYARD_HOME": str(home),
    } | extra


def job_state(home: Path, job_id: str) -> str:
    """A job's state from the `gpuyard up` of `home`, asked over HTTP as its platform admin: a poll
    costs a request, not a CLI process."""
    from gpuyard_client import GpuyardClient, resolve_endpoint

    with GpuyardClient(resolve_endpoint(home=home)) as client:
        return str(client.job(job_id)["state"])


class GpuyardUp:
    """`gpuyard up` in `home`, on a free port, in its own process group; its output in `<home>.log`.

    `start()` returns once it has announced itself in server.json (or fails with its output)."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None):
        self.home = home
        self.env = dict(env) if env is not None else without_gpuyard_settings()
        self.log = home.with_name(f"{home.name}.log")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> GpuyardUp:
        (self.home / "server.json").unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.process = process = subprocess.Popen(
                [sys.executable, "-m", "gpuyard.cli", "up", "--home", str(self.home), "--port", "0"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_until(
            lambda: (self.home / "server.json").exists() or process.poll() is not None,
            timeout_s=timeout_s,
            what=f"gpuyard up in {self.home}",
        )
        assert process.poll() is None, f"gpuyard up exited {process.returncode}:\n{self.output()}"
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "gpuyard up was not started"
        return self.process.pid

    @property
    def url(self) -> str:
        return str(json.loads((self.home / "server.json").read_text())["url"])

    @property
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def state(self, job_id: str) -> str:
        return job_state(self.home, job_id)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM to its process group, then its exit status (SIGKILL after `timeout_s`); None if not
        started."""
        if self.process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"gpuyard up did not stop in {timeout_s}s:\n{self.output()}") from None

    def kill(self) -> None:
        """SIGKILL to its whole process group (the control plane dies; its workers live on)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


class TcpProxy:
    """A TCP proxy the test can cut and restore, or black-hole (connections accepted, nothing passed
    either way) and heal: the network between a service and its database, or its cluster's API."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._passing = threading.Event()
        self._passing.set()

    def black_hole(self) -> None:
        """From now on, every byte either way is held: requests are taken and never answered."""
        self._passing.clear()

    def heal(self) -> None:
        """Bytes pass again (those held too: a client that gave up has closed its connection)."""
        self._passing.set()

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Refuse new connections and break every open one."""
        with self._lock:
            if self._listener:
                # shutdown wakes the thread blocked in accept(); close alone would leave it listening
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self._passing.wait()
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
