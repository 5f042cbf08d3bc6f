"""`make ui`: the Airflow, gpuyard and MLflow UIs on what `make demo` left in .gpuyard/demo/.

Airflow (standalone: api-server, scheduler, dag-processor, triggerer) on its demo home, with the
gpuyard page in its navigation (the plugin's app; queue, fleet, jobs' timelines, figures), gpuyard up
on its demo home (the API and its interactive docs), and the pipeline's MLflow tracking server
(pipelines/tracking_server.py, its UI and the artifacts it serves) on its store. Local only
(127.0.0.1), no login to Airflow (every Airflow user is an admin here); MLflow asks for one (its
admin's password is in the store's `mlflow-auth/admin.password`). Airflow's `gpuyard_default`
connection holds a new token of the pipeline's team, so a run triggered from its UI trains and
publishes; its `gpuyard_sign_in` connection maps Airflow's admins (every user, here) to team a's
members, so the gpuyard page opens without a gpuyard token (delegated by the demo's admin token).
Ctrl-C or SIGTERM stops all three and what they started (each runs in a session of its own: SIGTERM
to every process of it, then SIGKILL for what still runs after STOP_S).
Ports: AIRFLOW_UI_PORT (8080), GPUYARD_UI_PORT (8081), MLFLOW_UI_PORT (5000); GPUYARD_DEMO_HOME and
GPUYARD_DEMO_DAGS point it at another demo's state and DAGs folder (tests/airflow/test_pipeline_e2e.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from gpuyard_client import SERVER_FILE

from pipelines import mlflow_access, storage, tracking_server
from pipelines.definition import HOME_VARIABLE, REPOSITORY, load_definition
from pipelines.demo import BIN, DEMO, PIPELINE, airflow_environment, environment, team_token, wait_for_gpuyard

STOP_S = 15.0  # how long the three get to stop on SIGTERM, together


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops what `make ui` started, as Ctrl-C does


def main() -> int:
    if not (DEMO / "airflow" / "airflow.db").exists():
        raise SystemExit("nothing to show yet: run `make demo` first")
    os.environ[HOME_VARIABLE] = str(DEMO)
    ports = {
        name: os.environ.get(f"{name.upper()}_UI_PORT", default)
        for name, default in (("airflow", "8080"), ("gpuyard", "8081"), ("mlflow", "5000"))
    }
    definition = load_definition(PIPELINE)
    root = Path(storage.local_path(definition.data.root))
    pipeline = tracking_server.stored_credentials(root, mlflow_access.PIPELINE)
    logs = DEMO / "ui-logs"
    logs.mkdir(exist_ok=True)
    base = environment()
    home = DEMO / "gpuyard"
    (home / SERVER_FILE).unlink(missing_ok=True)  # left by a gpuyard that did not stop cleanly
    signal.signal(signal.SIGTERM, _interrupted)
    running: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, command: list[str], env: dict[str, str]) -> None:
        running[name] = subprocess.Popen(
            command,
            env=env,
            stdout=(logs / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    try:
        start(
            "gpuyard",
            [str(BIN / "gpuyard"), "up", "--port", ports["gpuyard"]],
            base | {"GPUYARD_HOME": str(home), "GPUYARD_WORKER_DIR": str(REPOSITORY)},
        )
        # the tracking server's own start: its store and artifacts for the platform's user only
        tracking = tracking_server.TrackingServer(root, logs / "mlflow.log", base, port=int(ports["mlflow"]))
        process = tracking.start().process
        assert process is not None  # started: it answered
        running["mlflow"] = process
        url = wait_for_gpuyard(running["gpuyard"], home, logs / "gpuyard.log")
        connection = {
            "conn_type": "gpuyard",
            "host": url,
            "password": team_token(home, base, "make ui: Airflow"),
            # the job link opens the gpuyard page, which links each job's MLflow run
            "extra": json.dumps(
                {
                    "ui_url": f"http://127.0.0.1:{ports['airflow']}/gpuyard",
                    "mlflow_ui_url": f"http://127.0.0.1:{ports['mlflow']}",
                }
            ),
        }
        sign_in = {  # the gpuyard page: Airflow's admins are team a's members (docs/ui.md, "Sign-in")
            "conn_type": "gpuyard",
            "password": (home / "admin.token").read_text().strip(),
            "extra": json.dumps({"roles": {"Admin": {"team": "a", "role": "member"}}}),
        }
        start(
            "airflow",
            [str(BIN / "airflow"), "standalone"],
            airflow_environment(connection, f"http://127.0.0.1:{ports['mlflow']}")
            | pipeline.env()
            | {
                "AIRFLOW_CONN_GPUYARD_SIGN_IN": json.dumps(sign_in),
                "AIRFLOW__API__PORT": ports["airflow"],
                "AIRFLOW__API__HOST": "127.0.0.1",
                # task processes report to the API server's execution API: on this port, not 8080's
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{ports['airflow']}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{ports['airflow']}/execution/",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            },
        )
        say_where(ports, definition.promotion.model, root, logs)
        while all(p.poll() is None for p in running.values()):
            time.sleep(1)
        failed = [name for name, p in running.items() if p.poll() is not None]
        print(f"{', '.join(failed)} stopped; see {logs}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(list(running.values()))


def say_where(ports: dict[str, str], model: str, root: Path, logs: Path) -> None:
    print(f"Airflow:  http://127.0.0.1:{ports['airflow']}/dags/{PIPELINE}  (no login)")
    print(
        "  trigger a run: unpause the DAG, then Trigger (the Params form: run date, steps, GPUs, ...);"
        " the training jobs run on this gpuyard as team a"
    )
    token = DEMO / "gpuyard" / "admin.token"
    print(
        f"gpuyard page in Airflow: http://127.0.0.1:{ports['airflow']}/plugin/gpuyard  "
        f"(as team a's member, Airflow's sign-in; or with a gpuyard token, e.g. the admin token in {token})"
    )
    print(f"gpuyard:  http://127.0.0.1:{ports['gpuyard']}/docs  (the API; admin token in {token})")
    print(
        f"MLflow:   http://127.0.0.1:{ports['mlflow']}/#/models/{model}  (user "
        f"{mlflow_access.ADMIN}, password in {root / tracking_server.AUTH_DIR / 'admin.password'})"
    )
    print(f"logs in {logs}; Ctrl-C stops all three")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process of each one's session, SIGKILL to those still there after STOP_S.
    The session, not the process group: Airflow runs each task in a process group of its own."""
    _signal_sessions(processes, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    _signal_sessions(processes, signal.SIGKILL)
    for process in processes:
        process.wait()


def _signal_sessions(processes: list[subprocess.Popen[bytes]], signum: int) -> None:
    sessions = {process.pid for process in processes}  # each started with start_new_session
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(entry)
            if os.getsid(pid) in sessions:
                os.kill(pid, signum)


if __name__ == "__main__":
    raise SystemExit(main())
