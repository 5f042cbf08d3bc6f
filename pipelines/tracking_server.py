"""The embedded profile's MLflow tracking server: `mlflow server` on a pipeline's data root.

A pipeline's store is shared by its jobs (the DAG run's parent run, the registry, the champion
alias), so it is not a file team users write (docs/security.md): the platform runs this server as
its own process, and the pipeline's tasks and its training jobs log to `url` over HTTP. Runs and the
registry are `sqlite:///<root>/mlflow.db`; the artifacts live in `<root>/mlartifacts`, served by the
server (`--serve-artifacts`: experiments it creates get `mlflow-artifacts:` locations, and clients
upload and download through it). Production runs the same server on PostgreSQL and an object store
(deploy/mlflow.yaml). `make demo`, `make ui` and the Airflow tests start one.

It asks for credentials (MLflow's basic-auth app, pipelines/mlflow_access.py): its user store is
`<root>/mlflow-auth/basic_auth.db`, and the passwords it hands out are kept beside it, one file
each (`<name>.password`), in that 0700 folder of the platform's user. The server runs with umask
077, and the store's files it made before are closed to other users: the data root is readable by
every local user (team workers among them), its MLflow files are not.
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

from pipelines import mlflow_access
from pipelines.mlflow_access import Credentials

MLFLOW = Path(sys.executable).parent / "mlflow"
AUTH_DIR = "mlflow-auth"
# MLflow 3's server-side jobs (GenAI evaluation, trace roll-ups) are not used here: without this the
# server starts huey consumer processes beside it that poll for jobs that never come.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def command(
    root: Path,
    port: int,
    *,
    auth: bool = True,
    artifacts: str | None = None,
    host: str = "127.0.0.1",
    backend: str | None = None,
) -> list[str]:
    """`mlflow server` on `host`:`port`, one worker, on `backend` (a database URL) or `root`'s SQLite
    store; the artifacts in `artifacts` (an object store's URL: s3://bucket/prefix), else
    `<root>/mlartifacts`."""
    return [
        str(MLFLOW),
        "server",
        f"--host={host}",
        f"--port={port}",
        "--workers=1",
        f"--backend-store-uri={backend or 'sqlite:///' + str(root / 'mlflow.db')}",
        f"--artifacts-destination={artifacts or (root / 'mlartifacts').as_uri()}",
        "--serve-artifacts",
        *(["--app-name=basic-auth"] if auth else []),
    ]


def stored_credentials(root: Path, username: str) -> Credentials:
    """`username`'s password on the server of `root`: made once, kept in `<root>/mlflow-auth` (0600)."""
    folder = root / AUTH_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / f"{username}.password"
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(mlflow_access.new_password())
    return Credentials(username, path.read_text().strip())


def auth_environment(root: Path) -> dict[str, str]:
    """What `mlflow server --app-name=basic-auth` on `root` needs: its configuration (written here),
    the admin's password (used on a first start) and a key for its CSRF tokens."""
    config = root / AUTH_DIR / "basic_auth.ini"
    admin = stored_credentials(root, mlflow_access.ADMIN)
    config.write_text(mlflow_access.auth_config(f"sqlite:///{root / AUTH_DIR / 'basic_auth.db'}"))
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin.password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": mlflow_access.new_password(),
    }


def close_store(root: Path) -> None:
    """The store's files an earlier server made (umask 022): for the platform's user only."""
    for path in (root / "mlflow.db", root / AUTH_DIR / "basic_auth.db"):
        if path.exists():
            path.chmod(0o600)
    if (root / "mlartifacts").is_dir():
        (root / "mlartifacts").chmod(0o700)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(Exception):
    """The port chosen for the server was bound by another process first."""


class TrackingServer:
    """The server of the data root `root` (a local directory), its output in `log`; with `auth`, it
    asks for credentials, and `provision` makes the pipeline's identity and the teams' users. With
    `artifacts`, an object store's URL, it keeps the artifacts there (reading the AWS settings of its
    environment, as production's does), still serving them to its clients. With `backend`, a database
    URL (PostgreSQL: `postgresql+psycopg://...`), its runs and registry live there. `host` and `port`:
    where it listens (an emulated cluster's gateway, for its pods; a free port unless given)."""

    def __init__(
        self,
        root: Path,
        log: Path,
        env: Mapping[str, str] | None = None,
        *,
        auth: bool = True,
        artifacts: str | None = None,
        host: str = "127.0.0.1",
        backend: str | None = None,
        port: int | None = None,
    ) -> None:
        self.root, self.log, self.env, self.auth, self.artifacts = root, log, env, auth, artifacts
        self.host, self.backend = host, backend
        self.chosen_port = port is None  # a free port, chosen again if another process takes it first
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> TrackingServer:
        """Start it and return once it answers /health (its first start creates the schema). A port it
        chose that another process bound between the choice and the server's bind is chosen again."""
        for _ in range(3):
            try:
                return self._start(timeout_s)
            except PortTaken:
                self.port = free_port()
                self.url = f"http://{self.host}:{self.port}"
        return self._start(timeout_s)

    def _start(self, timeout_s: float) -> TrackingServer:
        self.root.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        env = dict(os.environ if self.env is None else self.env) | SERVER_ENV
        if self.auth:
            env |= auth_environment(self.root)
        close_store(self.root)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command(
                    self.root,
                    self.port,
                    auth=self.auth,
                    artifacts=self.artifacts,
                    host=self.host,
                    backend=self.backend,
                ),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                umask=0o077,
            )
        deadline = time.monotonic() + timeout_s
        # One client for the wait: each new one builds a TLS context (55 ms of CPU on a 2-core machine).
        with httpx.Client(timeout=1) as http:
            while not self._healthy(http):
                self._started_or_fail(deadline, timeout_s, offset)
                time.sleep(0.2)
        return self

    def _started_or_fail(self, deadline: float, timeout_s: float, offset: int) -> None:
        """Stop it and raise, naming why, once it exited or the deadline passed."""
        assert self.process is not None
        code = self.process.poll()
        if code is None and time.monotonic() <= deadline:
            return
        self.stop()
        why = f"exited {code}" if code is not None else f"no answer within {timeout_s:g} s"
        with self.log.open("rb") as out:
            out.seek(offset)
            said = out.read().decode(errors="replace")
        if self.chosen_port and "address already in use" in said.lower():
            raise PortTaken(self.port)
        raise RuntimeError(
            f"the MLflow tracking server on {self.root} ({self.url}) did not start ({why}); "
            f"{self.log} ends:\n{said[-3000:]}"
        )

    def credentials(self, username: str) -> Credentials:
        """A user's credentials on this server (its admin, its pipeline, a team's user)."""
        return stored_credentials(self.root, username)

    def provision(self, teams: tuple[str, ...]) -> Credentials:
        """Make the pipeline's identity and a user per team (mlflow_access.provision); returns the
        pipeline's credentials. Team credentials: `credentials(mlflow_access.team_user(team))`."""
        pipeline = self.credentials(mlflow_access.PIPELINE)
        users = {team: self.credentials(mlflow_access.team_user(team)) for team in teams}
        mlflow_access.provision(self.url, self.credentials(mlflow_access.ADMIN), pipeline, users)
        return pipeline

    def _healthy(self, http: httpx.Client) -> bool:
        try:
            return http.get(f"{self.url}/health").status_code == 200
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
