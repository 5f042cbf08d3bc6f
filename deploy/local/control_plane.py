"""gpuyard's production processes on this machine, as a platform team runs them on a cluster:
`gpuyard migrate`, `gpuyard api` (two workers), `gpuyard relay` and two `gpuyard scheduler` replicas
with the Kubernetes launcher, on PostgreSQL and Redis, against the emulated cluster's API server.

They are the `gpuyard` command's own processes (nothing here imports gpuyard): each with its home
and log under `run`, its settings from `env` (the `GPUYARD_*` variables of docs/operations.md).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from local_cluster.apiserver import ApiServerEmulator, write_kubeconfig
from local_cluster.cluster import EmulatedCluster
from local_cluster.services import S3Server, free_port

# The Secret of each team's namespace that holds the object store's credentials: every worker pod gets
# its keys as variables (`kubernetes.env_from_secrets`), as `on_cluster` configures the control plane.
OBJECT_STORE_SECRET = "object-store"


def settings(
    *,
    database_url: str,
    redis_url: str,
    api_url: str,
    kubernetes_url: str,
    run: Path,
    lease_s: float,
    grace_s: float,
    checkpoint_store: str,
    namespace: str = "gpuyard",
) -> dict[str, str]:
    """The production profile's settings for these servers (the variables the manifests under deploy/
    set in a cluster); the Kubernetes API from a kubeconfig, as outside a cluster."""
    run.mkdir(parents=True, exist_ok=True)
    return {
        "GPUYARD_PROFILE": "production",
        "GPUYARD_DATABASE_URL": database_url,
        "GPUYARD_REDIS_URL": redis_url,
        "GPUYARD_LEASE_SECONDS": str(lease_s),
        "GPUYARD_GRACE_SECONDS": str(grace_s),
        "GPUYARD_CHECKPOINT_STORE": checkpoint_store,
        "GPUYARD_API_URL": api_url,
        "GPUYARD_PROBE_HOST": "127.0.0.1",
        "GPUYARD_KUBERNETES__IN_CLUSTER": "false",
        "GPUYARD_KUBERNETES__NAMESPACE": namespace,
        "GPUYARD_KUBERNETES__WATCH_TIMEOUT_S": "30",
        "KUBECONFIG": str(write_kubeconfig(kubernetes_url, run / "kubeconfig")),
    }


def object_store_secret(namespace: str, s3: S3Server) -> dict[str, Any]:
    """The object store's Secret for a team's namespace: the credentials of `s3`, and its endpoint."""
    metadata = {"name": OBJECT_STORE_SECRET, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": s3.env}


def on_cluster(
    cluster: EmulatedCluster,
    s3: S3Server,
    run: Path,
    env: Mapping[str, str],
    *,
    database_url: str,
    redis_url: str,
    lease_s: float,
    grace_s: float,
    checkpoint_store: str,
    stream: str,
) -> ControlPlane:
    """gpuyard's processes for an emulated cluster and its S3 endpoint, as `make demo-production` and
    benchmarks/time_to_resume.py run them: `env` (the machine's variables the processes need), the
    endpoint's credentials, `settings()`, the API on the cluster's gateway (where its pods reach it), a
    Redis stream of their own (`gpuyard:<stream>:<random>`: a machine's Redis may serve several), and
    every worker pod given its team namespace's `OBJECT_STORE_SECRET` (`object_store_secret` makes
    it). Not started: `up()` does."""
    port = free_port()
    extra = {
        "GPUYARD_REDIS_STREAM": f"gpuyard:{stream}:{uuid.uuid4().hex[:8]}",
        "GPUYARD_KUBERNETES__ENV_FROM_SECRETS": json.dumps([OBJECT_STORE_SECRET]),
    }
    configured = settings(
        database_url=database_url,
        redis_url=redis_url,
        api_url=f"http://{cluster.gateway}:{port}",
        kubernetes_url=cluster.url,
        run=run,
        lease_s=lease_s,
        grace_s=grace_s,
        checkpoint_store=checkpoint_store,
    )
    return ControlPlane(run, {**env, **s3.env, **configured, **extra}, host=cluster.gateway, port=port)


def _read(url: str) -> str:
    """The body of a GET, or "" when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ControlPlane:
    """The processes, started by `up()` and stopped by `stop()`; `url` is the API's (on `host`: where
    the cluster's pods reach this machine)."""

    def __init__(
        self, run: Path, env: Mapping[str, str], *, host: str = "127.0.0.1", port: int | None = None
    ):
        self.run, self.host = run, host
        self.api_port = port or free_port()
        self.url = f"http://{host}:{self.api_port}"
        self.env = dict(env)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.schedulers: dict[str, str] = {}  # name -> probe URL
        self._commands: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}  # name -> its args, env

    def gpuyard(self, *args: str) -> str:
        """Run one `gpuyard` command to its end; its output, or RuntimeError with its error."""
        done = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", *args],
            env={**self.env, "GPUYARD_HOME": str(self.run / "cli")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"gpuyard {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        self._commands[name] = (args, env)
        log = (self.run / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", *args],
            env={**self.env, "GPUYARD_HOME": str(self.run / name), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes[name] = process
        return process

    def up(self, timeout_s: float = 120.0) -> None:
        """Migrate the schema, start every process and wait for the API to be ready and one scheduler
        to lead."""
        self.run.mkdir(parents=True, exist_ok=True)
        self.gpuyard("migrate")
        self.start("api", "api", "--host", self.host, "--port", str(self.api_port), "--workers", "2")
        self.start("relay", "relay", GPUYARD_RELAY_PROBE_PORT=str(free_port()))
        for name in ("scheduler-1", "scheduler-2"):
            port = free_port()
            self.schedulers[name] = f"http://127.0.0.1:{port}"
            self.start(name, "scheduler", GPUYARD_SCHEDULER_PROBE_PORT=str(port))
        self.wait_for(lambda: _answers(f"{self.url}/readyz"), timeout_s, "the API")
        for name, url in self.schedulers.items():
            self.wait_for(lambda url=url: _answers(f"{url}/healthz"), timeout_s, f"{name}'s probe")
        self.leader()

    def supervise(self) -> list[str]:
        """Start again every process that exited (with its arguments and probe port), as a Deployment
        restarts its pods; their names."""
        restarted = []
        for name, process in list(self.processes.items()):
            if process.poll() is not None:
                args, env = self._commands[name]
                self.start(name, *args, **env)
                restarted.append(name)
        return restarted

    def wait_for(self, ready: Any, timeout_s: float, what: str, *, watch: bool = True) -> None:
        """Until `ready()`; with `watch`, RuntimeError naming the log of a process that exited meanwhile."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            for name, process in self.processes.items():
                if watch and process.poll() is not None:
                    tail = (self.run / f"{name}.log").read_text()[-3000:]
                    raise RuntimeError(f"gpuyard {name} exited ({process.returncode}): {tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what} (logs in {self.run})")
            time.sleep(0.2)

    def leader(self, timeout_s: float = 60.0) -> str:
        """The one live scheduler whose probe says it leads."""
        found: list[str] = []

        def one_leads() -> bool:
            found.clear()
            for name, url in self.schedulers.items():
                if self.processes[name].poll() is not None:
                    continue
                if "\ngpuyard_scheduler_leader 1.0" in _read(f"{url}/metrics"):
                    found.append(name)
            return len(found) == 1

        self.wait_for(one_leads, timeout_s, "one leading scheduler", watch=False)  # one may be killed
        return found[0]

    def team_token(self, team: str, description: str) -> str:
        created = json.loads(
            self.gpuyard("token", "create", "--team", team, "--description", description, "--json")
        )
        return str(created["token"])

    def namespaces(self) -> list[dict[str, Any]]:
        """What a cluster admin applies for the teams (`gpuyard kubernetes namespaces`)."""
        return [doc for doc in yaml.safe_load_all(self.gpuyard("kubernetes", "namespaces")) if doc]

    def apply_namespaces(self, emulator: ApiServerEmulator, api: k8s.CoreV1Api) -> list[dict[str, Any]]:
        """Apply them to the emulated cluster, as `kubectl apply -f -` would."""
        documents = self.namespaces()
        emulator.apply(api.api_client, documents)
        return documents

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
