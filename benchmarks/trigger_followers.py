"""One Airflow triggerer waiting on 1,000 deferred training tasks, three ways, in the same scenario.

The scenario: 1,000 gpuyard jobs, each deferred on by one task, run by the real scheduler (a process
of its own) through a fake launcher whose attempts run at once and end on a plan fixed by the seed
(each job runs 22-45 s; every third is preempted half-way once and runs again), so every mode sees
the same state changes at the same moments and the same tasks resumed as their jobs end. The API
(a process of its own, counting the requests it serves) and the store are on PostgreSQL, as in
production. The triggerer is Airflow's own (`airflow triggerer`), its task instances written into its
metadata database the way a task's defer writes them. The three ways:

- gpuyard: GpuJobTrigger, every job's changes told in its task's log, one shared long poll;
- polling: a stock-style trigger that GETs its job every 2 s until it ends, as the Kubernetes
  provider's pod trigger reads its pod (benchmarks/stock_triggers/polling.py);
- floor: Airflow's own DateTimeTrigger, firing at the moments the gpuyard run's jobs ended: what
  resuming 1,000 tasks at those moments costs Airflow whoever waits.

Measured in each, from the scheduler's start (floor: the first moment) until every task has resumed
(its trigger fired, then 5 s): the triggerer's CPU (its process tree), the API's CPU and the job reads
it served; before that, 20 s with no job changing. For gpuyard, each change's latency: from the
change (its event's `at`) to its line in the task's log. Goals: p99 <= 2 s; gpuyard's triggerer CPU
for the scenario at most half the polling one's and at most 1.25 times the floor's.

    .venv/bin/python benchmarks/trigger_followers.py [--tasks 1000] [--seconds 90]

Last line: `RESULT follow_p99_s=P cpu_vs_polling=X cpu_vs_floor=Y` (then each mode's share of a core
and the polling trigger's requests a second).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import multiprocessing.process
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STOCK_TRIGGERS = Path(__file__).resolve().parent / "stock_triggers"
DAG_ID = "follow_bench"
MODES = ("gpuyard", "polling", "floor")
TAIL_S = 5.0  # the window goes on this long after the last trigger fired: its task's resumption is in it

DAG_FILE = '''
"""The training task of benchmarks/trigger_followers.py: one DAG run per followed job."""
import datetime as dt
from airflow.sdk import DAG
from gpuyard_provider.operators.training import GpuTrainingOperator

with DAG("{dag_id}", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False):
    GpuTrainingOperator(
        task_id="train", name="bench", team="a", training_config="x.yaml", checkpoint_root="file:///tmp/bench"
    )
'''

DEFER = """
import datetime as dt, json, sys
from airflow.models.dagbag import DBDagBag
from airflow.models.trigger import Trigger
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from airflow.utils.types import DagRunTriggeredByType, DagRunType
from airflow._shared.timezones import timezone
from airflow.models.xcom import XComModel

# What a task's defer() leaves in the metadata database: a trigger row, the task instance DEFERRED on
# it. argv: the mode, then a file of run id -> the job id it follows (or the moment it fires, floor).
mode, waits = sys.argv[1], json.loads(open(sys.argv[2]).read())

def trigger_for(ti, wait):
    if mode == "gpuyard":
        from gpuyard_provider.triggers.job import GpuJobTrigger
        return GpuJobTrigger(job_id=wait, cursor=0, dag_id=ti.dag_id, run_id=ti.run_id,
                             task_id=ti.task_id, map_index=ti.map_index)
    if mode == "polling":
        from polling import PollingJobTrigger
        return PollingJobTrigger(job_id=wait)
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger
    return DateTimeTrigger(moment=dt.datetime.fromisoformat(wait))

with create_session() as session:
    dag = DBDagBag().get_latest_version_of_dag("{dag_id}", session=session)
    for run_id, wait in waits.items():
        run = dag.create_dagrun(
            run_id=run_id, logical_date=None, data_interval=None, run_after=timezone.utcnow(),
            run_type=DagRunType.MANUAL, state=DagRunState.RUNNING, triggered_by=DagRunTriggeredByType.TEST,
            triggering_user_name="bench", session=session,
        )
        [ti] = run.get_task_instances(session=session)
        row = Trigger.from_object(trigger_for(ti, wait))
        session.add(row)
        session.flush()
        ti.try_number = 1
        ti.state = TaskInstanceState.DEFERRED
        ti.trigger_id = row.id
        ti.next_method = "execute_complete"
        ti.next_kwargs = {{}}
        if mode == "gpuyard":
            from gpuyard_provider.triggers.job import CURSOR_XCOM
            XComModel.set(CURSOR_XCOM, 0, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id,
                          map_index=ti.map_index, session=session)
    session.commit()
print(json.dumps({{"deferred": len(waits)}}))
"""


@dataclass(frozen=True)
class Run:
    """How one job runs in every mode: its run time, and whether its first attempt is preempted half-way."""

    seconds: float
    preempted: bool


def plan(tasks: int, run_s: tuple[float, float], seed: int) -> list[Run]:
    rng = random.Random(seed)
    return [Run(rng.uniform(*run_s), i % 3 == 0) for i in range(tasks)]


class FakeLauncher:
    """Attempts that run at once and end as the plan says (a preempted job's first attempt half-way)."""

    def __init__(self, runs: Mapping[str, Run]) -> None:
        self.runs = runs
        self.lock = threading.Lock()
        self.attempts: dict[str, dict[str, Any]] = {}
        self.preempted: set[str] = set()

    def launch(self, request: Any) -> None:
        from gpuyard.launchers.base import Outcome

        with self.lock:
            if request.attempt_id in self.attempts:
                return
            run = self.runs[request.job_id]
            preempt = run.preempted and request.job_id not in self.preempted
            if preempt:
                self.preempted.add(request.job_id)
            self.attempts[request.attempt_id] = {
                "token": request.fencing_token,
                "ends": time.monotonic() + (run.seconds / 2 if preempt else run.seconds),
                "outcome": Outcome.PREEMPTED if preempt else Outcome.SUCCEEDED,
                "running_told": False,
            }

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        from gpuyard.launchers.base import Outcome

        with self.lock:
            if attempt_id in self.attempts:
                self.attempts[attempt_id] |= {"ends": time.monotonic(), "outcome": Outcome.FAILED}

    def observe(self) -> list[Any]:
        from gpuyard.clock import utcnow
        from gpuyard.launchers.base import Outcome, WorkerReport

        reports, now = [], time.monotonic()
        with self.lock:
            for attempt_id, a in self.attempts.items():
                if now >= a["ends"]:
                    code = 75 if a["outcome"] == Outcome.PREEMPTED else 0
                    reports.append(
                        WorkerReport(
                            attempt_id,
                            a["outcome"],
                            utcnow(),
                            exit_code=code,
                            reason=f"exited {code}",
                            disrupted=code == 75,
                        )
                    )
                elif not a["running_told"]:
                    reports.append(WorkerReport(attempt_id, Outcome.RUNNING, utcnow()))
        return reports

    def acknowledge(self, report: Any) -> None:
        from gpuyard.launchers.base import Outcome

        with self.lock:
            if report.attempt_id not in self.attempts:
                return
            if report.outcome == Outcome.RUNNING:
                self.attempts[report.attempt_id]["running_told"] = True
            else:
                del self.attempts[report.attempt_id]

    def alive(self) -> dict[str, int]:
        with self.lock:
            return {k: a["token"] for k, a in self.attempts.items() if time.monotonic() < a["ends"]}

    def starting(self) -> dict[str, int]:
        return {}  # its workers start at once

    def release(self, attempt_id: str) -> bool:
        with self.lock:
            self.attempts.pop(attempt_id, None)
        return True

    def reconcile(self, live: Mapping[str, Any]) -> list[Any]:
        return []

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        return iter(())


class ControlPlane:
    """The API in a process of its own (its CPU and the job reads it serves counted apart) and, once
    `start_scheduling` is called, the scheduler with the fake launcher in another."""

    def __init__(self, home: Path, slots: int, database_url: str | None) -> None:
        from gpuyard.services import ensure_admin_token
        from gpuyard.settings import load_settings
        from gpuyard.store.db import open_store

        self.settings_args = {"home": home, "local_slots": slots, "database_url": database_url}
        self.settings = load_settings(profile="embedded", **self.settings_args)
        self.engine = open_store(self.settings)
        self.admin = ensure_admin_token(self.engine, self.settings).read_text().strip()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        spawn = multiprocessing.get_context("spawn")
        self.job_reads = spawn.Value("q", 0)
        self.api = spawn.Process(
            target=serve_api, args=(self.settings_args, self.port, self.job_reads), name="api"
        )
        self.api.start()
        deadline = time.monotonic() + 60
        while not _answers(self.url):
            if time.monotonic() > deadline or not self.api.is_alive():
                raise SystemExit("the API did not start")
            time.sleep(0.1)
        self.stop = spawn.Event()
        self.scheduler: multiprocessing.process.BaseProcess | None = None

    def token(self, team: str) -> str:
        from gpuyard.clock import utcnow
        from gpuyard.store import teams

        with self.engine.begin() as conn:
            teams.ensure_team(
                conn, team, self.settings.default_quota.model_copy(update={"gpu_quota": 100_000}), utcnow()
            )
            return teams.create_token(conn, team, teams.Role.MEMBER, utcnow())

    def api_cpu(self) -> float:
        assert self.api.pid is not None
        times = psutil.Process(self.api.pid).cpu_times()
        return float(times.user + times.system)

    def start_scheduling(self, runs: Mapping[str, Run]) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.scheduler = spawn.Process(
            target=schedule, args=(self.settings_args, dict(runs), self.url, self.stop), name="scheduler"
        )
        self.scheduler.start()

    def close(self) -> None:
        self.stop.set()
        for process in (self.scheduler, self.api):
            if process is None:
                continue
            if process is self.api:
                process.terminate()
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        self.engine.dispose()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


def serve_api(settings_args: dict[str, Any], port: int, job_reads: Any) -> None:
    """The API process: gpuyard's app, each read of one job (`GET /v1/jobs/<id>`) counted."""
    from gpuyard.api.app import create_app
    from gpuyard.settings import load_settings
    from gpuyard.store.db import open_store

    settings = load_settings(profile="embedded", **settings_args)
    app = create_app(settings, open_store(settings), fleet=settings.fleet())

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"].startswith("/v1/jobs/"):
            with job_reads.get_lock():
                job_reads.value += 1
        await app(scope, receive, send)

    uvicorn.run(counted, host="127.0.0.1", port=port, log_level="warning")


def schedule(settings_args: dict[str, Any], runs: dict[str, Run], url: str, stop: threading.Event) -> None:
    """The scheduler process: passes every 0.5 s over the store, launching into the fake launcher."""
    from gpuyard.scheduler.service import SchedulerService
    from gpuyard.settings import load_settings
    from gpuyard.store.db import open_store

    settings = load_settings(profile="embedded", **settings_args)
    engine = open_store(settings)
    scheduler = SchedulerService(
        engine, FakeLauncher(runs), settings.fleet(), api_url=lambda: url, lease_ttl_s=600
    )
    try:
        scheduler.run(stop, interval_s=0.5)
    finally:
        engine.dispose()


class Observer(threading.Thread):
    """A reader of the event log in this process: when each event became visible through the API,
    to tell the API's share of the latency from the triggerer's."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.seen: dict[int, float] = {}
        self.succeeded: set[str] = set()  # jobs whose job.succeeded event it saw
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        ) as api:
            cursor = api.get("/v1/events").json()["cursor"]
            while not self.stop.is_set():
                page = api.get("/v1/events", params={"after": cursor, "wait": 5, "limit": 1000}).json()
                now = time.time()
                for event in page["events"]:
                    self.seen.setdefault(event["seq"], now)
                    if event["type"] == "job.succeeded":
                        self.succeeded.add(event["job_id"])
                cursor = page["cursor"]


@contextlib.contextmanager
def store_database(server: str, purpose: str) -> Iterator[str | None]:
    """A PostgreSQL database of the benchmark's own (dropped when the generator closes), else None."""
    if server == "none":
        yield None
        return
    import psycopg

    name = f"trigger_followers_{purpose}_{os.getpid()}"
    try:
        with psycopg.connect(server, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as error:
        print(f"no PostgreSQL at {server} ({error}); the store is SQLite", flush=True)
        yield None
        return
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def airflow_env(home: Path, dags: Path, url: str | None, token: str | None) -> dict[str, str]:
    """Airflow's environment: the bench DAG, gpuyard's plugin, the stock triggers importable, and the
    `gpuyard_default` connection where there is a control plane to follow."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPUYARD_"))}
    env |= {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        "AIRFLOW__TRIGGERER__CAPACITY": "2000",
        "PATH": f"{BIN}:{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(STOCK_TRIGGERS), env.get("PYTHONPATH", "")])),
    }
    if url is not None:
        connection = {"conn_type": "gpuyard", "host": url, "password": token}
        env["AIRFLOW_CONN_GPUYARD_DEFAULT"] = json.dumps(connection)
    return env


def triggerer_cpu(process: psutil.Process) -> dict[str, float]:
    """CPU seconds of the triggerer's supervisor and of its children (the trigger runner, serve-logs)."""

    def seconds(p: psutil.Process) -> float:
        try:
            times = p.cpu_times()
            return float(times.user + times.system)
        except psutil.Error:
            return 0.0

    try:
        children = process.children(recursive=True)
    except psutil.Error:
        children = []
    return {"supervisor": seconds(process), "children": sum(seconds(c) for c in children)}


def run(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed:\n{done.stderr[-3000:]}")


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def told_lines(logs: Path) -> Iterator[tuple[str, int, float]]:
    """(job id, event seq, when the trigger logged it) for every change a trigger told."""
    import re

    narrated = re.compile(r"gpuyard job (job-[0-9a-f]+) #(\d+): ")
    for path in logs.rglob("*.log.trigger.*"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            at = dt.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
            for match in narrated.finditer(record.get("event", "")):  # a record tells a batch
                yield match.group(1), int(match.group(2)), at


def log_traffic(logs: Path, since: float, until: float) -> tuple[int, int]:
    """(records, bytes) the triggers' logs received between two moments: Airflow's triggerer
    supervisor reads its log socket 4 KiB at a time, and reads its database on every such read."""
    records = size = 0
    for path in logs.rglob("*.log.trigger.*"):
        for line in path.read_bytes().splitlines():
            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
            if since <= dt.datetime.fromisoformat(stamp).timestamp() <= until:
                records, size = records + 1, size + len(line) + 1
    return records, size


def read_probe(path: Path) -> dict[str, float]:
    """The supervisor's running totals (benchmarks/triggerer_probe), written once a second."""
    deadline = time.monotonic() + 5
    while not path.is_file():
        if time.monotonic() > deadline:
            raise SystemExit(f"--attribute: the triggerer wrote no probe file at {path}")
        time.sleep(0.2)
    return json.loads(path.read_text())


def print_attribution(before: Mapping[str, float], after: Mapping[str, float], wall: float) -> None:
    """The supervisor's CPU between two probe readings, step by step (each within a second)."""
    spent = {k: after[k] - before[k] for k in after}
    passes = max(spent["passes"], 1)
    print(
        f"  supervisor, by the probe: {spent['cpu_s']:.1f}s CPU, {spent['passes']:.0f} passes of its loop "
        f"({spent['passes'] / wall:.1f}/s, {1000 * spent['pass_cpu_s'] / passes:.1f} ms of CPU a pass)"
    )
    steps = {
        "resuming the tasks whose triggers fired (handle_events)": "handle_events_cpu_s",
        "assigning and listing its triggers (load_triggers)": "load_triggers_cpu_s",
        "deleting unused triggers (clean_unused)": "clean_unused_cpu_s",
        "reading the runner's sockets and answering it (_service_subprocess)": "_service_subprocess_cpu_s",
        "heartbeat": "heartbeat_cpu_s",
    }
    for what, key in steps.items():
        print(f"    {spent[key]:5.1f}s ({spent[key] / wall:.3f} of a core) {what}")


@dataclass
class Measured:
    """One mode's figures: the triggerer's CPU (supervisor, children) over the idle spell and the window,
    the API's CPU and job reads over the window, and (gpuyard) each change's latency."""

    mode: str
    idle: dict[str, float]
    idle_s: float
    cpu: dict[str, float]
    window_s: float
    resumed: int
    api_cpu: float = 0.0
    job_reads: int = 0
    idle_job_reads: int = 0
    latencies: list[float] = field(default_factory=list)
    visible: list[float] = field(default_factory=list)
    ended_after_s: list[float] = field(default_factory=list)  # when each job ended, from the window's start
    attribution: tuple[dict[str, float], dict[str, float]] | None = None

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    @property
    def share(self) -> float:
        return self.cpu_s / self.window_s


class Airflow:
    """An Airflow home with the one-task DAG and its metadata database; the triggerer once started."""

    def __init__(
        self, work: Path, args: argparse.Namespace, database: str | None, gpuyard: tuple[str, str] | None
    ):
        """`gpuyard`: the API's URL and a team token for the `gpuyard_default` connection (None: none)."""
        self.work, self.home, dags = work, work / "airflow", work / "dags"
        self.home.mkdir(parents=True)
        dags.mkdir()
        (dags / f"{DAG_ID}.py").write_text(DAG_FILE.format(dag_id=DAG_ID))
        self.env = airflow_env(self.home, dags, *(gpuyard or (None, None)))
        if args.pace is not None:
            self.env["AIRFLOW__GPUYARD__FOLLOW_PACE_S"] = str(args.pace)
        if database:  # psycopg 3 for both of Airflow's engines (its async default wants asyncpg)
            url = database.replace("postgresql://", "postgresql+psycopg://")
            self.env |= {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
            }
        self.probe = work / "probe.json" if args.attribute else None
        if self.probe:  # the triggerer alone runs with the probe
            path = [str(Path(__file__).resolve().parent / "triggerer_probe"), self.env["PYTHONPATH"]]
            self.triggerer_env = self.env | {
                "PYTHONPATH": os.pathsep.join(path),
                "GPUYARD_TRIGGERER_PROBE": str(self.probe),
            }
        else:
            self.triggerer_env = self.env
        self.triggerer: subprocess.Popen[bytes] | None = None
        self.database = database
        airflow = str(BIN / "airflow")
        run([airflow, "db", "migrate"], self.env)
        run([airflow, "dags", "reserialize"], self.env)

    def defer(self, mode: str, waits: Mapping[str, str]) -> None:
        (self.work / "waits.json").write_text(json.dumps(waits))
        run(
            [sys.executable, "-c", DEFER.format(dag_id=DAG_ID), mode, str(self.work / "waits.json")], self.env
        )

    def start_triggerer(self, started: str, count: int) -> psutil.Process:
        """Start `airflow triggerer` and wait until `count` triggers' logs say `started`."""
        self.triggerer = subprocess.Popen(
            [str(BIN / "airflow"), "triggerer"],
            env=self.triggerer_env,
            stdout=(self.work / "triggerer.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 600
        while (done := self.count_logs(started)) < count:
            print(f"  {done}/{count} triggers started", flush=True)
            if time.monotonic() > deadline or self.triggerer.poll() is not None:
                raise SystemExit(
                    f"the triggerer did not start every trigger; see {self.work / 'triggerer.log'}"
                )
            time.sleep(5)
        return psutil.Process(self.triggerer.pid)

    def count_logs(self, saying: str) -> int:
        """The triggers' logs that hold `saying`: one log per deferred task."""
        return sum(1 for p in (self.home / "logs").rglob("*.log.trigger.*") if saying in p.read_text())

    def resumed(self) -> int:
        """The task instances no longer deferred: their trigger fired and the supervisor resumed them
        (`Trigger.submit_event`). Read from the metadata database: a fired trigger's own log line may
        land in the triggerer's log once its task's log is closed."""
        query = f"SELECT count(*) FROM task_instance WHERE dag_id = '{DAG_ID}' AND state != 'deferred'"
        if self.database is None:
            with sqlite3.connect(self.home / "airflow.db") as conn:
                return int(conn.execute(query).fetchone()[0])
        import psycopg

        with psycopg.connect(self.database) as conn:
            return int(conn.execute(query).fetchone()[0])  # type: ignore[index]

    def wait_resumed(self, count: int, timeout_s: float) -> None:
        """Until `count` tasks resumed, then TAIL_S for what the supervisor still does for them."""
        deadline = time.monotonic() + timeout_s
        while (resumed := self.resumed()) < count:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"only {resumed} of {count} tasks resumed in {timeout_s:.0f} s; see {self.work}"
                )
            time.sleep(1)
        time.sleep(TAIL_S)

    def idle(self, process: psutil.Process, seconds: float) -> dict[str, float]:
        before = triggerer_cpu(process)
        time.sleep(seconds)
        after = triggerer_cpu(process)
        return {k: after[k] - before[k] for k in after}

    def close(self) -> None:
        if self.triggerer is not None and self.triggerer.poll() is None:
            os.killpg(self.triggerer.pid, signal.SIGTERM)
            try:
                self.triggerer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.triggerer.pid, signal.SIGKILL)


STARTED = {
    "gpuyard": ": submitted: ",
    "polling": "starting",
    "floor": "starting",
}  # GpuJobTrigger: backlog told


def follow(work: Path, mode: str, args: argparse.Namespace, runs: list[Run]) -> Measured:
    """gpuyard or polling: the jobs run on the plan while 1,000 tasks wait on them in the triggerer."""
    trigger = "GpuJobTrigger" if mode == "gpuyard" else "PollingJobTrigger"
    print(f"[{mode}] {args.tasks} jobs, each waited on by a task deferred on {trigger}", flush=True)
    with contextlib.ExitStack() as stack:
        database = stack.enter_context(store_database(args.postgres, f"gpuyard_{mode}"))
        metadata = stack.enter_context(store_database(args.postgres, f"airflow_{mode}"))
        plane = ControlPlane(work / "gpuyard", slots=args.tasks, database_url=database)
        stack.callback(plane.close)
        token = plane.token("a")  # the jobs' submitter and the triggers' connection
        spec = {
            "name": "bench",
            "team": "a",
            "image": "x",
            "command": ["true"],
            "resources": {"gpus": 1, "gpu_types": ["cpu"]},
            "preemptible": True,
        }
        with httpx.Client(
            base_url=plane.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as api:
            jobs = {f"bench-{i:04d}": api.post("/v1/jobs", json=spec).json()["id"] for i in range(args.tasks)}
        airflow = Airflow(work, args, metadata, (plane.url, token))
        stack.callback(airflow.close)
        airflow.defer(mode, jobs)
        triggerer = airflow.start_triggerer(STARTED[mode], args.tasks)
        reads_before = plane.job_reads.value
        idle = airflow.idle(triggerer, args.idle_seconds)
        idle_reads = plane.job_reads.value - reads_before
        print(
            f"  no job changing: triggerer {sum(idle.values()):.1f}s CPU over {args.idle_seconds:.0f}s",
            flush=True,
        )

        observer = Observer(plane.url, plane.admin)
        observer.start()
        stack.callback(observer.stop.set)
        cpu_before, api_before, reads_before = (
            triggerer_cpu(triggerer),
            plane.api_cpu(),
            plane.job_reads.value,
        )
        probed_before = read_probe(airflow.probe) if airflow.probe else {}
        began, started_at = time.monotonic(), time.time()
        plane.start_scheduling({jobs[f"bench-{i:04d}"]: run for i, run in enumerate(runs)})
        while len(observer.succeeded) < args.tasks:
            print(f"  {len(observer.succeeded)}/{args.tasks} jobs ended", flush=True)
            if time.monotonic() - began > args.seconds * 3:
                raise SystemExit(
                    f"[{mode}] only {len(observer.succeeded)} of {args.tasks} jobs ended in time"
                )
            time.sleep(5)
        airflow.wait_resumed(args.tasks, args.seconds)
        window_s = time.monotonic() - began
        cpu_after, api_after, reads_after = triggerer_cpu(triggerer), plane.api_cpu(), plane.job_reads.value
        probed_after = read_probe(airflow.probe) if airflow.probe else {}
        events = all_events(plane.url, plane.admin)
        measured = Measured(
            mode,
            idle,
            args.idle_seconds,
            {k: cpu_after[k] - cpu_before[k] for k in cpu_after},
            window_s,
            airflow.resumed(),
            api_cpu=api_after - api_before,
            job_reads=reads_after - reads_before,
            idle_job_reads=idle_reads,
            attribution=(probed_before, probed_after) if airflow.probe else None,
        )
        ended = [stamp(e) - started_at for e in events.values() if e["type"] == "job.succeeded"]
        measured.ended_after_s = sorted(ended)
        if mode == "gpuyard":
            measured.latencies, measured.visible = follow_latencies(
                events, airflow.home / "logs", observer.seen
            )
            records, size = log_traffic(airflow.home / "logs", started_at, started_at + window_s)
            print(f"  the triggers' logs: {records} records, {size / 1024:.0f} KiB over the window")
        return measured


def floor(work: Path, args: argparse.Namespace, ended_after_s: list[float]) -> Measured:
    """Airflow's own DateTimeTrigger resuming the tasks at the moments the gpuyard run's jobs ended."""
    print(f"[floor] {len(ended_after_s)} tasks deferred on DateTimeTrigger, at the gpuyard run's moments")
    with contextlib.ExitStack() as stack:
        metadata = stack.enter_context(store_database(args.postgres, "airflow_floor"))
        airflow = Airflow(work, args, metadata, None)
        stack.callback(airflow.close)
        anchor = time.time() + args.floor_lead_s  # the window's start: the triggerer is up by then
        moments = {
            f"bench-{i:04d}": dt.datetime.fromtimestamp(anchor + after, dt.UTC).isoformat()
            for i, after in enumerate(ended_after_s)
        }
        airflow.defer("floor", moments)
        triggerer = airflow.start_triggerer(STARTED["floor"], len(moments))
        if time.time() + args.idle_seconds > anchor:
            raise SystemExit(
                f"[floor] the triggerer took longer than --floor-lead-s ({args.floor_lead_s:.0f} s) to start"
            )
        idle = airflow.idle(triggerer, args.idle_seconds)
        print(
            f"  no task resuming: triggerer {sum(idle.values()):.1f}s CPU over {args.idle_seconds:.0f}s",
            flush=True,
        )
        time.sleep(max(0.0, anchor - time.time()))
        before, began = triggerer_cpu(triggerer), time.monotonic()
        probed_before = read_probe(airflow.probe) if airflow.probe else {}
        time.sleep(max(ended_after_s))
        airflow.wait_resumed(len(moments), args.seconds)
        window_s = time.monotonic() - began
        after = triggerer_cpu(triggerer)
        probed_after = read_probe(airflow.probe) if airflow.probe else {}
        return Measured(
            "floor",
            idle,
            args.idle_seconds,
            {k: after[k] - before[k] for k in after},
            window_s,
            airflow.resumed(),
            attribution=(probed_before, probed_after) if airflow.probe else None,
        )


def stamp(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()


def all_events(url: str, token: str) -> dict[int, dict[str, Any]]:
    events: dict[int, dict[str, Any]] = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        cursor = 0
        while page := api.get("/v1/events", params={"after": cursor, "limit": 1000}).json()["events"]:
            events |= {e["seq"]: e for e in page}
            cursor = page[-1]["seq"]
    return events


def follow_latencies(
    events: Mapping[int, dict[str, Any]], logs: Path, seen: Mapping[int, float]
) -> tuple[list[float], list[float]]:
    """For each change told after the first wave, from its `at` to its line in the task's log, and to
    when a reader in the API's own process saw it. The first wave places every job in one pass (all
    stamped at its start); from the moment every job has run once, changes come spread in time."""
    first_runs: dict[str, float] = {}
    for event in sorted(events.values(), key=lambda e: e["seq"]):
        if event["type"] == "attempt.running":
            first_runs.setdefault(event["job_id"], stamp(event))
    settled = max(first_runs.values())
    latencies, visible = [], []
    for _job, seq, logged in told_lines(logs):
        at = stamp(events[seq])
        if at > settled:
            latencies.append(logged - at)
            if seq in seen:
                visible.append(seen[seq] - at)
    return sorted(latencies), sorted(visible)


def report(measured: Mapping[str, Measured]) -> str:
    """Each mode's figures, and the RESULT line."""
    gpuyard, polling, floor_ = measured["gpuyard"], measured["polling"], measured["floor"]
    for m in measured.values():
        split = ", ".join(f"{k} {v:.1f}s" for k, v in m.cpu.items())
        print(
            f"[{m.mode}] triggerer: {sum(m.cpu.values()):.1f}s CPU over {m.window_s:.1f}s "
            f"({m.share:.3f} of a core; {split}); {m.resumed} tasks resumed; "
            f"idle {sum(m.idle.values()) / m.idle_s:.3f} of a core"
        )
        if m.mode != "floor":
            print(
                f"  gpuyard API: {m.api_cpu:.1f}s CPU ({m.api_cpu / m.window_s:.3f} of a core), "
                f"{m.job_reads / m.window_s:.1f} job reads/s (idle: {m.idle_job_reads / m.idle_s:.1f}/s)"
            )
        if m.attribution:
            print_attribution(*m.attribution, m.window_s)
    p50, p99 = percentile(gpuyard.latencies, 0.5), percentile(gpuyard.latencies, 0.99)
    print(
        f"[gpuyard] {len(gpuyard.latencies)} changes told after the first wave: p50 {p50:.3f}s p99 {p99:.3f}s"
    )
    if gpuyard.visible:
        v50, v99 = percentile(gpuyard.visible, 0.5), percentile(gpuyard.visible, 0.99)
        print(f"  of which until a reader in the API's process saw it: p50 {v50:.3f}s p99 {v99:.3f}s")
    return (
        f"RESULT follow_p99_s={p99:.3f} cpu_vs_polling={gpuyard.cpu_s / polling.cpu_s:.2f} "
        f"cpu_vs_floor={gpuyard.cpu_s / floor_.cpu_s:.2f} gpuyard_share={gpuyard.share:.3f} "
        f"polling_share={polling.share:.3f} floor_share={floor_.share:.3f} "
        f"polling_reads_per_s={polling.job_reads / polling.window_s:.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=90.0, help="jobs run a quarter to half of this")
    parser.add_argument("--seed", type=int, default=7, help="the plan: each job's run time")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="CPU measured before any change")
    parser.add_argument(
        "--floor-lead-s", type=float, default=240.0, help="the floor's triggerer starts within this"
    )
    parser.add_argument(
        "--pace", type=float, default=None, help="the followers' pace, [gpuyard] follow_pace_s (default 0.5)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="split the supervisor's CPU among the steps of its loop (benchmarks/triggerer_probe)",
    )
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server for the control plane's store and Airflow's metadata (databases of "
        "their own are made and dropped), as in production; 'none': SQLite for both",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trigger-followers-"))
    runs = plan(args.tasks, (args.seconds / 4, args.seconds / 2), args.seed)
    measured: dict[str, Measured] = {}
    try:
        measured["gpuyard"] = follow(work / "gpuyard", "gpuyard", args, runs)
        measured["polling"] = follow(work / "polling", "polling", args, runs)
        measured["floor"] = floor(work / "floor", args, measured["gpuyard"].ended_after_s)
        print(report(measured))
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
