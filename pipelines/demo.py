"""`make demo`: the flights_delay retraining DAG, run through Airflow on an embedded gpuyard.

1. `gpuyard up`: SQLite store, in-process bus, scheduler, local launcher on 2 CPU slots (no GPU
   here, and every output says so; run as root, its workers run as team a's own user), a token of
   team `a`, and the pipeline's MLflow tracking server (pipelines/tracking_server.py), which the
   tasks (as the pipeline's MLflow identity) and the training jobs (as team a's MLflow user, whose
   credentials are team a's gpuyard secrets) log to over HTTP;
2. `airflow dags test flights_delay` (Airflow's state in .gpuyard/demo/airflow, the `gpuyard_default`
   connection from the environment) on the real 2013 New York flights of the definition's 21 days:
   ingest, Great Expectations, Spark, Feast, the training sets, a grid of GPU jobs, evaluation,
   publication in the MLflow registry;
3. ONE injected preemption: once the first training job has a durable checkpoint, its attempt is
   preempted through the admin API (`POST /v1/attempts/{id}/preempt`), checkpoints, stops and
   resumes from that checkpoint on a next attempt;
4. progress as it happens (each task, the training jobs' story from the task log), the whole log in
   .gpuyard/demo/dags-test.log, and the outcome: the model version and its alias, the metrics
   against the champion, the training jobs' attempts with the progress lost, and `make ui`.

gpuyard and Airflow start fresh each time; the data and the MLflow registry (under .gpuyard/demo/data)
stay, so a second `make demo` compares its candidate with the first one's champion and promotes or
rejects it by the definition's rule, and says which and why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuyard_client import SERVER_FILE, ApiError, GpuyardClient, resolve_endpoint
from rich.console import Console

from pipelines import mlflow_access, storage
from pipelines.definition import HOME_VARIABLE, REPOSITORY, load_definition
from pipelines.tracking_server import TrackingServer

PIPELINE = "flights_delay"
# Where make demo keeps its state and make ui finds it, and the DAGs both show: the repository's by
# default (a test points both at a world of its own).
DEMO = Path(os.environ.get("GPUYARD_DEMO_HOME") or REPOSITORY / ".gpuyard" / "demo")
DAGS = Path(os.environ.get("GPUYARD_DEMO_DAGS") or REPOSITORY / "dags")
BIN = Path(sys.executable).parent
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

TASK_EVENT = re.compile(r"\[DAG TEST\] (starting|end task) task_id=(\S+) map_index=(-?\d+)")
TELLS = re.compile(
    r"(gpuyard job job-\S+ #\d+: .*?|gpuyard job job-\S+ (SUCCEEDED|FAILED|CANCELLED) after .*?|"
    r"(PROMOTED|REJECTED): .*?)\s+\["
)


def environment() -> dict[str, str]:
    """The demo's processes: nothing of the caller's gpuyard, Airflow or MLflow settings leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "AIRFLOW", "MLFLOW_"))}
    return env | {
        "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "GX_ANALYTICS_ENABLED": "false",
        HOME_VARIABLE: str(DEMO),
    }


def airflow_environment(connection: dict[str, str], tracking_uri: str) -> dict[str, str]:
    return environment() | {
        "MLFLOW_TRACKING_URI": tracking_uri,
        "AIRFLOW_HOME": str(DEMO / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPOSITORY / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",  # GPU jobs wait in the triggerer, not a worker
        # LocalExecutor runs this many task processes (Airflow's default, 32, on a laptop's cores)
        "AIRFLOW__CORE__PARALLELISM": str(max(2, os.cpu_count() or 2)),
        "AIRFLOW_CONN_GPUYARD_DEFAULT": json.dumps(connection),
    }


def start_gpuyard(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    home = DEMO / "gpuyard"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = env | {"GPUYARD_HOME": str(home), "GPUYARD_WORKER_DIR": str(REPOSITORY), "GPUYARD_LOCAL_SLOTS": "2"}
    log = (DEMO / "gpuyard.log").open("wb")
    server = subprocess.Popen(
        [str(BIN / "gpuyard"), "up", "--port", "0"],
        env=env,
        cwd=REPOSITORY,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_gpuyard(server, home, DEMO / "gpuyard.log")
    return server, home


def wait_for_gpuyard(server: subprocess.Popen[bytes], home: Path, log: Path) -> str:
    """The URL `gpuyard up` announces in its home once it serves (its server file)."""
    deadline = time.monotonic() + 90
    while not (home / SERVER_FILE).exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gpuyard up did not start; see {log}")
        time.sleep(0.2)
    return str(json.loads((home / SERVER_FILE).read_text())["url"])


def team_token(home: Path, env: dict[str, str], description: str = "make demo: Airflow") -> str:
    """A new token of team a (the pipeline's team), for Airflow's `gpuyard_default` connection."""
    done = subprocess.run(
        [str(BIN / "gpuyard"), "token", "create", "--team", "a", "--description", description],
        env=env | {"GPUYARD_HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


class Preemption(threading.Thread):
    """Preempts the first training job's attempt once, after its first durable checkpoint."""

    def __init__(self, admin: GpuyardClient) -> None:
        super().__init__(name="demo-preemption", daemon=True)
        self.admin, self.done = admin, threading.Event()
        self.attempt: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        if (event := first_checkpoint(self.admin, self.stop)) is None:
            return
        self.attempt = event["attempt_id"]
        self.admin.preempt_attempt(self.attempt)
        console.print(
            f"  [bold yellow]⚡ injected preemption[/] of attempt {self.attempt} "
            f"(job {event['job_id']}) after its checkpoint at step {event['data'].get('step')}"
        )
        self.done.set()


def first_checkpoint(admin: GpuyardClient, stop: threading.Event) -> dict[str, Any] | None:
    """The first `attempt.checkpointed` event, followed on the event log (riding out API outages)
    until `stop`; None if stopped first. The demos inject their fault at that moment."""
    cursor = 0
    while not stop.is_set():
        try:
            page = admin.events(after=cursor, wait_s=5)
        except (ApiError, OSError):
            time.sleep(1)
            continue
        cursor = page["cursor"]
        for event in page["events"]:
            if event["type"] == "attempt.checkpointed" and event["attempt_id"]:
                return dict(event)
    return None


def follow(process: subprocess.Popen[str], log: Path) -> None:
    """Show the run as it goes: tasks starting and ending, and what the training tasks tell."""
    started: dict[str, float] = {}
    with log.open("w") as out:
        for line in process.stdout or ():
            out.write(line)
            if match := TASK_EVENT.search(line):
                what, task, index = match.groups()
                name = task + (f"[{index}]" if index != "-1" else "")
                if what == "starting":
                    started[name] = time.monotonic()
                    console.print(f"[cyan]▶ {name}[/]")
                else:
                    console.print(
                        f"[green]  ✓ {name}[/] [dim]{time.monotonic() - started.get(name, 0):.0f}s[/]"
                    )
            elif match := TELLS.search(line):
                console.print(f"    {match.group(1)}", markup=False)


def summary(admin: GpuyardClient, airflow_db: Path, slots: str = "CPU slots") -> None:
    """The outcome: model version, alias, metrics against the champion, the jobs' attempts (on nodes'
    `slots`)."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    definition = load_definition(PIPELINE)
    with sqlite3.connect(airflow_db) as conn:
        rows = dict(
            conn.execute(
                "SELECT task_id, value FROM xcom WHERE dag_id = ? AND key = 'return_value' "
                "AND task_id = 'evaluate'",
                (PIPELINE,),
            ).fetchall()
        )
        published = conn.execute(
            "SELECT state FROM task_instance WHERE dag_id = ? AND task_id = 'publish'", (PIPELINE,)
        ).fetchone()
    verdict = json.loads(rows["evaluate"])
    mlflow = MlflowClient(definition.tracking_uri)
    model, alias = definition.promotion.model, definition.promotion.alias
    champion = mlflow.get_model_version_by_alias(model, alias)
    candidate = verdict["candidate"]
    promoted = published is not None and published[0] == "success"
    console.rule("the outcome")
    tags = mlflow.get_model_version(model, candidate["version"]).tags
    console.print(
        f"[bold]{'PROMOTED' if promoted else 'REJECTED'}[/]: {model} version {candidate['version']} "
        f"{'is now' if promoted else 'is not'} @{alias}; @{alias} = version {champion.version}"
    )
    console.print(f"  why: {tags.get('promotion_reason') or tags.get('rejected')}", markup=False)
    metric = verdict["metric"]
    line = f"  {metric} on the held-out days: candidate {candidate['value']:.4f}"
    if verdict["champion"]:
        line += f", champion (version {verdict['champion']['version']}) {verdict['champion']['value']:.4f}"
    console.print(line + (" (no champion before)" if not verdict["champion"] else ""))
    jobs = [j for j in admin.jobs(limit=50) if j["spec"]["labels"].get("pipeline") == PIPELINE]
    for job in reversed(jobs):
        detail = admin.job(job["id"])
        console.print(f"  training job {job['id']} ({job['name']}): {detail['state']}")
        for attempt in detail["attempts"]:
            nodes = ", ".join(f"{n['node']} GPUs {n['gpus']}" for n in attempt["placement"].get("nodes", []))
            lost = max(0, (attempt["step"] or 0) - (attempt["checkpoint_step"] or 0))
            console.print(
                f"    attempt {attempt['number']} {attempt['state']:<9} on {nodes} ({slots}): steps to "
                f"{attempt['step']}, last checkpoint {attempt['checkpoint_step']}, "
                f"{lost if attempt['state'] in ('PREEMPTED', 'LOST') else 0} step(s) lost"
                + (f"; {attempt['reason']}" if attempt["reason"] else ""),
                markup=False,
            )


def main() -> int:
    started = time.monotonic()
    os.environ[HOME_VARIABLE] = str(DEMO)  # the definition's data root, for this process too
    definition = load_definition(PIPELINE)
    shutil.rmtree(DEMO / "airflow", ignore_errors=True)
    (DEMO / "airflow").mkdir(parents=True)
    env = environment()
    console.rule(
        "1. gpuyard up: SQLite store, in-process bus, scheduler, local launcher on 2 CPU slots (no GPU)"
    )
    server, home = start_gpuyard(env)
    tracking = TrackingServer(Path(storage.local_path(definition.data.root)), DEMO / "mlflow.log", env)
    try:
        url = json.loads((home / SERVER_FILE).read_text())["url"]
        token = team_token(home, env)
        admin = GpuyardClient(resolve_endpoint(url=url, home=home))
        console.print(f"gpuyard at {url}; team a token in the `gpuyard_default` Airflow connection")
        with console.status(
            f"starting the MLflow tracking server on {definition.data.root} (a first start creates its store)"
        ):
            os.environ["MLFLOW_TRACKING_URI"] = tracking.start().url  # the definition's, for this process too
            team = definition.job.team
            pipeline = tracking.provision((team,))
            os.environ.update(pipeline.env())  # this process reads the outcome as the pipeline
            mlflow_access.hand_to_team(admin, team, tracking.credentials(mlflow_access.team_user(team)))
        console.print(
            f"MLflow tracking server at {tracking.url} on {definition.data.root}: the pipeline's tasks "
            f"sign in as {pipeline.username!r}, team {team}'s jobs as {mlflow_access.team_user(team)!r} "
            f"(its gpuyard secrets {', '.join(mlflow_access.SECRET_ENV.values())})"
        )
        connection = {"conn_type": "gpuyard", "host": url, "password": token}
        airflow_env = airflow_environment(connection, tracking.url) | pipeline.env()
        subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"], env=airflow_env, capture_output=True, check=True
        )
        window = definition.window()
        console.rule(
            f"2. airflow dags test {PIPELINE}: {window.prepare_start}..{window.run_date} of 2013 flights, "
            f"a grid of {len(definition.job.grid)} training jobs"
        )
        preemption = Preemption(admin)
        preemption.start()
        dag_test = subprocess.Popen(
            [str(BIN / "airflow"), "dags", "test", PIPELINE],
            env=airflow_env,
            cwd=REPOSITORY,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        follow(dag_test, DEMO / "dags-test.log")
        code = dag_test.wait()
        preemption.stop.set()
        if code != 0 or "DagRun Finished" not in (DEMO / "dags-test.log").read_text():
            console.print(f"[red]the DAG run failed[/]; the whole log: {DEMO / 'dags-test.log'}")
            return 1
        if not preemption.done.is_set():
            console.print("[red]the training job ended before the injected preemption could land[/]")
        summary(admin, DEMO / "airflow" / "airflow.db")
        console.print(
            f"lineage: MLflow run of the DAG run and its training children in "
            f"{storage.join(definition.data.root, 'mlflow.db')}\n"
            "open the Airflow, gpuyard and MLflow UIs on this data: [bold]make ui[/]"
        )
        console.print(f"[dim]make demo took {time.monotonic() - started:.0f}s; state in {DEMO}[/]")
        return 0
    finally:
        tracking.stop()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    raise SystemExit(main())
