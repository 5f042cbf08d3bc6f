"""The control plane as production runs it, as real processes: `gpuyard api` (2 workers), `gpuyard
relay`, two `gpuyard scheduler` replicas with the local launcher, all through the fault proxies to
PostgreSQL and Redis, all sharing one home (the launcher's attempt directories on "this machine").

Like a Deployment's controller, `supervise()` restarts any component that exited (the suite kills
them). Every component runs under libfaketime with a clock file of its own, so the suite can skew
one component's clock (and its workers': they inherit it) at any moment, while monotonic time stays
true (FAKETIME_DONT_FAKE_MONOTONIC=1; `clockskew/sitecustomize.py` works around its time.sleep bug).
Given a `Network`, every component runs in a network namespace of its own (its workers with it), so
the suite can cut one off from all the others (`network.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from gpuyard.store.tables import leaders
from gpuyard_client import tls_context
from sqlalchemy import Engine, select

from .network import Network

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
COMPONENTS = ("api", "relay", "scheduler-1", "scheduler-2")
SKEW = Path(__file__).parent / "clockskew"


@dataclass
class Component:
    name: str
    argv: list[str]
    clock: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.poll() is None else None


class Cluster:
    def __init__(
        self,
        run: Path,
        *,
        database_url: str,
        redis_url: str,
        api_port: int,
        lease_s: float,
        network: Network | None = None,
        launcher: Mapping[str, str] | None = None,
    ):
        """`launcher`: the launcher's settings, where it is not the local launcher (whose fleet is
        two nodes of 2 GPUs of this machine)."""
        self.run, self.api_port, self.lease_s, self.network = run, api_port, lease_s, network
        self.api_host = network.address("api") if network else "127.0.0.1"
        self.home = run / "home"
        self.logs = run / "logs"
        for directory in (self.home, self.logs, run / "clock"):
            directory.mkdir(parents=True, exist_ok=True)
        if not Path(LIBFAKETIME).exists():
            raise RuntimeError(f"the fault suite needs libfaketime ({LIBFAKETIME}): apt-get install faketime")
        fleet = run / "fleet.yaml"
        fleet.write_text(
            "nodes:\n"
            + "".join(
                f"  - {{name: {name}, site: s, cluster: c, domain: d, gpu_type: cpu, gpus: 2}}\n"
                for name in ("node-a", "node-b")
            )
        )
        self.env = {
            **os.environ,
            "GPUYARD_PROFILE": "production",
            "GPUYARD_DATABASE_URL": database_url,
            "GPUYARD_REDIS_URL": redis_url,
            "GPUYARD_HOME": str(self.home),
            "GPUYARD_LAUNCHER": "local",
            "GPUYARD_FLEET_FILE": str(fleet),
            # Production requires checkpoint roots: each team's is `<this store>/<team>` (a local path
            # is allowed: the local launcher's workers share this machine's disk).
            "GPUYARD_CHECKPOINT_STORE": (run / "checkpoints").as_uri(),
            "GPUYARD_API_URL": self.api_url,
            "GPUYARD_LEASE_SECONDS": str(lease_s),
            # Production's ratio of the bus timeout to the lease (5 s to 60 s): a scheduler waiting on
            # a black-holed Redis must still renew its leader lease (half a lease) in time.
            "GPUYARD_BUS_TIMEOUT_SECONDS": f"{max(0.5, lease_s / 12):g}",
            "GPUYARD_GRACE_SECONDS": "5",
            "GPUYARD_DB_POOL_SIZE": "6",
            "GPUYARD_WORKER_DIR": str(run),
            # The workers write their journal into the run's folder, the launcher's own (mode 0700):
            # they run as the launcher's user, by the operator's explicit choice.
            "GPUYARD_WORKER_USERS": "off",
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_CACHE_DURATION": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SKEW), os.environ.get("PYTHONPATH")])),
            "FAULTS_LOG": "1",
            # The workers keep their scheduler's skewed clock (the sandbox passes nothing else on).
            "GPUYARD_WORKER_ENV_PASSTHROUGH": json.dumps(
                [
                    "LD_PRELOAD",
                    "FAKETIME_DONT_FAKE_MONOTONIC",
                    "FAKETIME_CACHE_DURATION",
                    "FAKETIME_TIMESTAMP_FILE",
                    "PYTHONPATH",
                    "FAULTS_LOG",
                ]
            ),
        }
        if launcher is not None:
            del self.env["GPUYARD_FLEET_FILE"], self.env["GPUYARD_WORKER_USERS"]
            self.env |= launcher
        cli = [sys.executable, "-m", "gpuyard.cli"]
        commands = {
            "api": [*cli, "api", "--host", self.api_host, "--port", str(api_port), "--workers", "2"],
            "relay": [*cli, "relay"],
            "scheduler-1": [*cli, "scheduler"],
            "scheduler-2": [*cli, "scheduler"],
        }
        assert tuple(commands) == COMPONENTS
        self.components = {
            name: Component(name, argv, run / "clock" / name) for name, argv in commands.items()
        }
        for component in self.components.values():
            component.clock.write_text("+0s\n")

    @property
    def api_url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"

    # -- processes ------------------------------------------------------------------------------------

    def _start(self, component: Component) -> None:
        with (self.logs / f"{component.name}.log").open("ab") as log:
            log.write(f"--- start {component.starts + 1} at {time.monotonic():.3f}\n".encode())
            log.flush()
            component.process = subprocess.Popen(  # nsenter execs the command: one pid
                self.network.argv(component.name, component.argv) if self.network else component.argv,
                env={**self.env, "FAKETIME_TIMESTAMP_FILE": str(component.clock)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        component.starts += 1

    def start(self, engine: Engine, timeout_s: float = 120.0) -> None:
        """Every component at once (the schema is migrated already); returns once the API answers
        and a scheduler leads."""
        for component in self.components.values():
            self._start(component)
        deadline = time.monotonic() + timeout_s
        while not (self.api_ready() and self.leader(engine)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the control plane is not up after {timeout_s:g}s: see {self.logs}")
            for component in self.components.values():
                if component.process is not None and component.process.poll() is not None:
                    raise RuntimeError(
                        f"{component.name} exited at start: see {self.logs / component.name}.log"
                    )
            time.sleep(0.2)

    def api_ready(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=2, verify=tls_context()).status_code == 200
        except httpx.HTTPError:
            return False

    def supervise(self) -> list[str]:
        """Restart every component that exited; returns their names."""
        restarted = []
        for component in self.components.values():
            if component.process is not None and component.process.poll() is not None:
                self._start(component)
                restarted.append(component.name)
        return restarted

    def kill(self, name: str) -> int | None:
        """SIGKILL a component; its pid, or None if it was not running."""
        pid = self.components[name].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid

    def api_workers(self) -> list[int]:
        """The pids of the API's worker processes (children of uvicorn's supervisor)."""
        master = self.components["api"].pid
        if master is None:
            return []
        children = Path(f"/proc/{master}/task/{master}/children")
        try:
            pids = [int(pid) for pid in children.read_text().split()]
        except OSError:
            return []
        return [pid for pid in pids if b"spawn_main" in _cmdline(pid) or b"multiprocessing" in _cmdline(pid)]

    def leader(self, engine: Engine) -> str | None:
        """The scheduler replica holding the leader lease (the row names its pid), if it runs."""
        with engine.connect() as conn:
            holder = conn.execute(select(leaders.c.holder).where(leaders.c.name == "scheduler")).scalar()
        if holder is None:
            return None
        for name in ("scheduler-1", "scheduler-2"):
            pid = self.components[name].pid
            if pid is not None and f":{pid}:" in holder:
                return name
        return None

    def skew(self, name: str, offset_s: float) -> None:
        """Set a component's clock `offset_s` off (0: true); it takes effect within a second."""
        self.components[name].clock.write_text(f"{offset_s:+.0f}s\n")

    def stop(self) -> None:
        for component in self.components.values():
            if component.pid is not None:
                component.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for component in self.components.values():
            if component.process is None:
                continue
            try:
                component.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                component.process.kill()
                component.process.wait()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def labelled(label: str, value: str) -> dict[str, list[int]]:
    """Live processes whose environment has `label=value`, by their GPUYARD_ATTEMPT_ID."""
    wanted = f"{label}={value}".encode()
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if wanted in environ and state != "Z":
            attempt = next((v[19:].decode() for v in environ if v.startswith(b"GPUYARD_ATTEMPT_ID=")), "")
            found.setdefault(attempt, []).append(int(entry.name))
    return found
