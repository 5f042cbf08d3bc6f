"""Real services for the Airflow tests: an embedded gpuyard, a gate in front of its API, and Airflow's
own processes (api-server, scheduler, dag-processor, triggerer) on a LocalExecutor.

The gate is an HTTP proxy the test holds requests in: it forwards a request, and when a rule
matches it keeps the answer until the test lets it go, so the test can kill the process that asked
at exactly that point (the process is found by the TCP connection it holds to the gate).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil
from airflow_harness import PYTHON, ROOT, airflow_environment
from gpuyard_client import Endpoint, GpuyardClient, tls_context
from servers import free_port, wait_until

GPUYARD = str(Path(PYTHON).parent / "gpuyard")
AIRFLOW = str(Path(PYTHON).parent / "airflow")
# Headers the gate sets itself (it answers with a fresh body, decoded by httpx).
HOP_HEADERS = ("host", "content-length", "transfer-encoding", "connection", "content-encoding")


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """SIGTERM the process group this test started, then SIGKILL what is left."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def logged_error(line: str) -> str:
    """An error a task log line records, with its exception's type and message (Airflow writes
    JSON lines, the exception under `error_detail`); "" for any other line."""
    try:
        record = json.loads(line)
    except ValueError:
        return line[-300:] if "ERROR" in line else ""
    if not isinstance(record, dict) or record.get("level") != "error":
        return ""
    raised = [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in record.get("error_detail") or []]
    return "; ".join([str(record.get("event", ""))[:200], *raised])[-400:]


@dataclass
class Gpuyard:
    """`gpuyard up` in a process group of its own, with a team token."""

    home: Path
    slots: int = 4
    process: subprocess.Popen[bytes] | None = None
    url: str = ""
    token: str = ""
    admin_token: str = ""

    def start(self) -> Gpuyard:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "AIRFLOW", "MLFLOW_"))}
        env |= {
            "GPUYARD_HOME": str(self.home),
            "GPUYARD_WORKER_DIR": str(ROOT),
            "GPUYARD_LOCAL_SLOTS": str(self.slots),
            "GPUYARD_GRACE_SECONDS": "20",
        }
        self.env = env
        log = (self.home.parent / "gpuyard.log").open("wb")
        self.process = subprocess.Popen(
            [GPUYARD, "up", "--port", "0"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server = self.home / "server.json"
        wait_until(lambda: server.exists() or self.process.poll() is not None, 60, what="gpuyard up")
        assert self.process.poll() is None, (self.home.parent / "gpuyard.log").read_text()
        self.url = json.loads(server.read_text())["url"]
        self.admin_token = (self.home / "admin.token").read_text().strip()
        self.token = self.mint("a")
        return self

    def mint(self, team: str) -> str:
        """A new member token of `team` (which it creates), minted by the admin through the client: the
        CLI's `gpuyard token create` would cost a process of 1.4 CPU-s."""
        with GpuyardClient(Endpoint(self.url, self.admin_token)) as admin:
            return str(admin.create_token(team)["token"])

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            verify=tls_context(),
        )

    def jobs(self, name: str) -> list[dict[str, Any]]:
        with self.client(self.admin_token) as client:
            items = client.get("/v1/jobs", params={"limit": 500}).json()["items"]
        return [job for job in items if job["name"] == name]

    def job(self, job_id: str) -> dict[str, Any]:
        with self.client(self.admin_token) as client:
            return dict(client.get(f"/v1/jobs/{job_id}").json())

    def stop(self) -> None:
        """Stop `gpuyard up`, then kill the workers it launched: they outlive it by design (a
        restarted control plane adopts them), and a test that ended before its job would leave
        them training into the next tests."""
        if self.process is not None:
            stop_group(self.process)
        for process in psutil.process_iter(["cmdline"]):
            if str(self.home) in " ".join(process.info["cmdline"] or []):
                with contextlib.suppress(psutil.NoSuchProcess):
                    for worker in [*process.children(recursive=True), process]:
                        worker.kill()


@dataclass
class Hold:
    """One held answer: `arrived` is set when it is held; `release()` lets it go."""

    method: str
    path: str
    client_port: int
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()

    def client_pid(self) -> int:
        """The process holding the connection this request came in on."""
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == self.client_port and conn.pid:
                return int(conn.pid)
        raise AssertionError(f"no process holds the connection from port {self.client_port}")


class Gate:
    """An HTTP proxy in front of the gpuyard API; `hold(rule)` holds the answer of the next request
    the rule matches (the request itself reached the API: its effect is committed)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.http = httpx.Client(
            base_url=upstream, timeout=120, verify=tls_context()
        )  # shared by its threads
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._rules: list[tuple[Callable[[str, str, bytes], bool], Hold | None]] = []
        self._lock = threading.Lock()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                answer = gate.http.request(self.command, self.path, content=body, headers=headers)
                hold = gate._match(self.command, self.path, body, self.client_address[1])
                if hold is not None:
                    hold.arrived.set()
                    hold.released.wait(120)
                payload = answer.content
                with contextlib.suppress(OSError):
                    self.send_response(answer.status_code)
                    for key, value in answer.headers.items():
                        if key.lower() not in (
                            "content-length",
                            "transfer-encoding",
                            "connection",
                            "content-encoding",
                        ):
                            self.send_header(key, value)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def hold(self, rule: Callable[[str, str, bytes], bool]) -> Hold:
        hold = Hold("", "", 0)
        with self._lock:
            self._rules.append((rule, hold))
        return hold

    def _match(self, method: str, path: str, body: bytes, client_port: int) -> Hold | None:
        with self._lock:
            for index, (rule, hold) in enumerate(self._rules):
                if hold is not None and rule(method, path, body):
                    del self._rules[index]
                    hold.method, hold.path, hold.client_port = method, path, client_port
                    return hold
        return None

    def stop(self) -> None:
        self._server.shutdown()
        self.http.close()


def written(api: httpx.Client, method: str, path: str, body: dict[str, Any]) -> httpx.Response:
    """The API's answer to a write, asked again after a busy database's 500: on SQLite the api-server
    fails a request (and rolls it back) while the scheduler writes, as happened on a loaded machine,
    and a client tries again."""

    def answered() -> httpx.Response | None:
        response = api.request(method, path, json=body)
        busy = response.status_code == 500 and "Database error" in response.text
        return None if busy else response

    return wait_until(answered, 60, 1.0, what=f"{method} {path} answered past a busy database")


def triggered(api: httpx.Client, dag_id: str, body: dict[str, Any]) -> str:
    """The id of a manual run of the DAG (`body`: the trigger's fields but its id), made under an id
    of the caller's own: a try again after a 500 that had committed finds its run (409, the id being
    this call's) instead of making a second one."""
    run_id = f"manual__{body.get('logical_date') or dt.datetime.now(dt.UTC).isoformat()}"
    response = written(api, "POST", f"/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, **body})
    assert response.status_code in (200, 409), response.text
    return run_id


class AirflowStack:
    """Airflow 3's processes on a LocalExecutor, sharing one AIRFLOW_HOME and a SQLite database."""

    COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(self, home: Path, dags: Path, **env: str) -> None:
        self.home, self.port = home, free_port()
        self.env = airflow_environment(
            home,
            AIRFLOW__CORE__DAGS_FOLDER=str(dags),
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="8",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{self.port}",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
            AIRFLOW__API_AUTH__JWT_SECRET="gpuyard-tests-only",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="3",
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="3600",
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
            AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
            AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT="30",
            **env,
        )
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}/api/v2", timeout=30, verify=tls_context()
        )

    def start(self) -> AirflowStack:
        subprocess.run([AIRFLOW, "db", "migrate"], env=self.env, capture_output=True, check=True)
        for component in self.COMPONENTS:
            self.start_component(component)
        wait_until(self._healthy, 120, 0.5, what="the Airflow api-server")
        return self

    def start_component(self, component: str) -> None:
        log = (self.home / f"{component}.log").open("ab")
        self.processes[component] = subprocess.Popen(
            [AIRFLOW, component],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill_component(self, component: str) -> None:
        """SIGKILL the component's whole process group: a crash, nothing is shut down cleanly."""
        process = self.processes.pop(component)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def _healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self.api.get("/monitor/health").status_code == 200
        return False

    def wait_for_dag(self, dag_id: str, timeout_s: float = 120) -> None:
        def parsed() -> bool:
            response = self.api.get(f"/dags/{dag_id}")
            return response.status_code == 200

        wait_until(parsed, timeout_s, 0.5, what=f"DAG {dag_id} parsed")

    def trigger(
        self, dag_id: str, conf: dict[str, Any] | None = None, partition_key: str | None = None
    ) -> str:
        body = {"logical_date": None, "conf": conf or {}, "partition_key": partition_key}
        return triggered(self.api, dag_id, body)

    def ti(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        if map_index >= 0:
            path += f"/{map_index}"
        return dict(self.api.get(path).json())

    def wait_ti(
        self, dag_id: str, run_id: str, task_id: str, states: set[str], timeout_s: float = 240
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            ti = self.ti(dag_id, run_id, task_id)
            return ti if ti.get("state") in states else None

        return wait_until(reached, timeout_s, 0.5, what=f"{task_id} in {states}")  # type: ignore[no-any-return]

    def wait_run(self, dag_id: str, run_id: str, expected: str, timeout_s: float = 240) -> None:
        """Wait for the DAG run to end (success or failed), and fail naming why if not as `expected`."""

        def ended() -> str | None:
            state = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}").json().get("state")
            return state if state in ("success", "failed") else None

        state = wait_until(ended, timeout_s, 0.5, what=f"DAG run {run_id} ended")
        assert state == expected, f"DAG run {run_id} of {dag_id} ended {state}: {self.why(dag_id, run_id)}"

    def why(self, dag_id: str, run_id: str) -> str:
        """One line on the run's unsuccessful tasks: each one's state, try and last error logged, and
        any heartbeat timeout the scheduler detected (a run the suite's load starved shows here)."""
        tis = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        told = []
        for ti in tis:
            if ti["state"] in ("success", "skipped"):
                continue
            errors = [
                error
                for text in self.logs(dag_id, run_id, ti["task_id"]).values()
                for line in text.splitlines()
                if (error := logged_error(line))
            ]
            last = errors[-1] if errors else "no error logged"
            told.append(f"{ti['task_id']} {ti['state']} (try {ti['try_number']}): {last}")
        scheduler = self.home / "scheduler.log"
        timeouts = [
            line[-300:]
            for line in (scheduler.read_text(errors="replace") if scheduler.exists() else "").splitlines()
            if "without a heartbeat" in line and run_id in line
        ]
        return " | ".join(told + timeouts) or "every task succeeded or was skipped"

    def logs(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str]:
        """Every log file of the task instance (each try's and each trigger's), by file name."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return {p.name: p.read_text() for p in sorted(folder.glob("*.log*"))} if folder.exists() else {}

    def all_logs(self) -> Iterator[tuple[Path, str]]:
        for path in (self.home / "logs").rglob("*"):
            if path.is_file():
                yield path, path.read_text(errors="replace")
        for component in self.COMPONENTS:
            path = self.home / f"{component}.log"
            if path.exists():
                yield path, path.read_text(errors="replace")

    def stop(self) -> None:
        for process in self.processes.values():  # all told at once: each takes seconds to shut down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            stop_group(process)
        self.processes.clear()
        self.api.close()
