"""`make ui`: the Airflow, gpuyard and MLflow UIs on what `make demo` left in .gpuyard/demo/.

Airflow (standalone: api-server, scheduler, dag-processor, triggerer) on its demo home, with the
gpuyard page in its navigation (the plugin's app; queue, fleet, jobs' timelines, figures), gpuyard up
on its demo home (the API and its interactive docs), and the pipeline's MLflow tracking server
(pipelines/tracking_server.py, its UI and the artifacts it serves) on its store. Local only
(127.0.0.1), no login to Airflow (every Airflow user is an admin here); MLflow asks for one (its
admin's password is in the store's `mlflow-auth/admin.password`). Ctrl-C stops them.
Ports: AIRFLOW_UI_PORT (8080), GPUYARD_UI_PORT (8081), MLFLOW_UI_PORT (5000).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from pipelines import mlflow_access, storage, tracking_server
from pipelines.definition import HOME_VARIABLE, load_definition
from pipelines.demo import BIN, DEMO, PIPELINE, airflow_environment, environment


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
    commands = {
        "airflow": (
            [str(BIN / "airflow"), "standalone"],
            airflow_environment(
                {
                    "conn_type": "gpuyard",
                    "host": f"http://127.0.0.1:{ports['gpuyard']}",
                    # the job link opens the gpuyard page, which links each job's MLflow run
                    "extra": json.dumps(
                        {
                            "ui_url": f"http://127.0.0.1:{ports['airflow']}/gpuyard",
                            "mlflow_ui_url": f"http://127.0.0.1:{ports['mlflow']}",
                        }
                    ),
                },
                f"http://127.0.0.1:{ports['mlflow']}",
            )
            | pipeline.env()
            | {
                "AIRFLOW__API__PORT": ports["airflow"],
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            },
        ),
        "gpuyard": (
            [str(BIN / "gpuyard"), "up", "--port", ports["gpuyard"]],
            base | {"GPUYARD_HOME": str(DEMO / "gpuyard"), "GPUYARD_WORKER_DIR": str(DEMO.parents[1])},
        ),
        "mlflow": (
            tracking_server.command(root, int(ports["mlflow"])),
            base | tracking_server.auth_environment(root),
        ),
    }
    running = {
        name: subprocess.Popen(
            command,
            env=env,
            stdout=(logs / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, (command, env) in commands.items()
    }
    print(f"Airflow:  http://127.0.0.1:{ports['airflow']}/dags/{PIPELINE}  (no login)")
    token = DEMO / "gpuyard" / "admin.token"
    print(
        f"gpuyard page in Airflow: http://127.0.0.1:{ports['airflow']}/plugin/gpuyard  "
        f"(sign in with a gpuyard token, e.g. the admin token in {token})"
    )
    print(f"gpuyard:  http://127.0.0.1:{ports['gpuyard']}/docs  (the API; admin token in {token})")
    print(
        f"MLflow:   http://127.0.0.1:{ports['mlflow']}/#/models/{definition.promotion.model}  (user "
        f"{mlflow_access.ADMIN}, password in {root / tracking_server.AUTH_DIR / 'admin.password'})"
    )
    print(f"logs in {logs}; Ctrl-C stops all three")
    try:
        while all(p.poll() is None for p in running.values()):
            time.sleep(1)
        failed = [name for name, p in running.items() if p.poll() is not None]
        print(f"{', '.join(failed)} stopped; see {logs}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for process in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in running.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)


if __name__ == "__main__":
    raise SystemExit(main())
