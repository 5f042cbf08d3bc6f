"""One Airflow triggerer following 1,000 deferred training tasks whose gpuyard jobs change state.

The control plane is the real API (uvicorn, in this process) and the real scheduler (a process of
its own, as in production: in one process the two would share one interpreter lock), on PostgreSQL,
with a fast fake launcher in place of processes: an attempt runs as soon as it is launched and ends
after a few seconds, and every third job is preempted once on the way (it goes back to the queue
and runs again), so each job changes state 7 to 13 times. The triggerer is Airflow's own
(`airflow triggerer`, a process of its own) with 1,000 task instances deferred to GpuJobTrigger (one
DAG run each of a one-task DAG), written into its metadata database the way a task's defer writes
them.

Measured, once every trigger follows its job and the scheduler starts: for each state change a
trigger told in its task's log, the time from the change (the event's `at`) to the log line; and
the triggerer's CPU time (its process and children) over the wall time. Goal: p99 <= 2 s, under
10% of one core.

    .venv/bin/python benchmarks/trigger_followers.py [--tasks 1000] [--seconds 90]
prints `RESULT follow_p99_s=... triggerer_cpu_share=...`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import multiprocessing.process
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DAG_ID = "follow_bench"

DAG_FILE = '''
"""The training task of benchmarks/trigger_followers.py: one DAG run per followed job."""
import datetime as dt
from airflow.sdk import DAG
from gpuyard.airflow.operators.training import GpuTrainingOperator

with DAG("{dag_id}", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False):
    GpuTrainingOperator(
        task_id="train", name="bench", team="a", training_config="x.yaml", checkpoint_root="file:///tmp/bench"
    )
'''

DEFER = """
import json, sys
from airflow.models.dagbag import DBDagBag
from airflow.models.trigger import Trigger
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from airflow.utils.types import DagRunTriggeredByType, DagRunType
from airflow._shared.timezones import timezone
from airflow.models.xcom import XComModel
from gpuyard.airflow.triggers.job import CURSOR_XCOM, GpuJobTrigger

# What a task's defer() leaves in the metadata database: a trigger row, the task instance DEFERRED on it.
jobs = json.loads(open(sys.argv[1]).read())
with create_session() as session:
    dag = DBDagBag().get_latest_version_of_dag("{dag_id}", session=session)
    for run_id, job_id in jobs.items():
        run = dag.create_dagrun(
            run_id=run_id, logical_date=None, data_interval=None, run_after=timezone.utcnow(),
            run_type=DagRunType.MANUAL, state=DagRunState.RUNNING, triggered_by=DagRunTriggeredByType.TEST,
            triggering_user_name="bench", session=session,
        )
        [ti] = run.get_task_instances(session=session)
        trigger = GpuJobTrigger(job_id=job_id, cursor=0, dag_id=ti.dag_id, run_id=ti.run_id,
                                task_id=ti.task_id, map_index=ti.map_index)
        row = Trigger.from_object(trigger)
        session.add(row)
        session.flush()
        ti.try_number = 1
        ti.state = TaskInstanceState.DEFERRED
        ti.trigger_id = row.id
        ti.next_method = "execute_complete"
        ti.next_kwargs = {{}}
        XComModel.set(CURSOR_XCOM, 0, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id,
                      map_index=ti.map_index, session=session)
    session.commit()
print(json.dumps({{"deferred": len(jobs)}}))
"""


class FakeLauncher:
    """Attempts that run at once and end after a while; every third job is preempted once."""

    def __init__(self, run_s: tuple[float, float], seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.run_s = run_s
        self.lock = threading.Lock()
        self.attempts: dict[str, dict[str, Any]] = {}
        self.preempted: set[str] = set()

    def launch(self, request: Any) -> None:
        from gpuyard.launchers.base import Outcome

        with self.lock:
            if request.attempt_id in self.attempts:
                return
            duration = self.rng.uniform(*self.run_s)
            preempt = int(request.job_id[-4:], 16) % 3 == 0 and request.job_id not in self.preempted
            if preempt:
                self.preempted.add(request.job_id)
            self.attempts[request.attempt_id] = {
                "token": request.fencing_token,
                "ends": time.monotonic() + (duration / 2 if preempt else duration),
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
    """The API in this process and, once `start_scheduling` is called, the scheduler with the fake
    launcher in a process of its own."""

    def __init__(self, home: Path, slots: int, run_s: tuple[float, float], database_url: str | None) -> None:
        from gpuyard.api.app import create_app
        from gpuyard.services import ensure_admin_token, open_store
        from gpuyard.settings import load_settings

        self.settings_args = {"home": home, "local_slots": slots, "database_url": database_url}
        self.run_s = run_s
        self.settings = load_settings(profile="embedded", **self.settings_args)
        self.engine = open_store(self.settings)
        self.admin = ensure_admin_token(self.engine, self.settings).read_text().strip()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(self.settings, self.engine, fleet=self.settings.fleet())
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.serving = threading.Thread(target=self.server.run, daemon=True)
        self.serving.start()
        while not self.server.started:
            time.sleep(0.05)
        spawn = multiprocessing.get_context("spawn")
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

    def start_scheduling(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.scheduler = spawn.Process(
            target=schedule, args=(self.settings_args, self.run_s, self.url, self.stop), name="scheduler"
        )
        self.scheduler.start()

    def close(self) -> None:
        self.stop.set()
        if self.scheduler is not None:
            self.scheduler.join(timeout=30)
            if self.scheduler.is_alive():
                self.scheduler.kill()
        self.server.should_exit = True
        self.serving.join(timeout=30)
        self.engine.dispose()


def schedule(
    settings_args: dict[str, Any], run_s: tuple[float, float], url: str, stop: threading.Event
) -> None:
    """The scheduler process: passes every 0.5 s over the store, launching into the fake launcher."""
    from gpuyard.scheduler.service import SchedulerService
    from gpuyard.services import open_store
    from gpuyard.settings import load_settings

    settings = load_settings(profile="embedded", **settings_args)
    engine = open_store(settings)
    scheduler = SchedulerService(
        engine, FakeLauncher(run_s), settings.fleet(), api_url=lambda: url, lease_ttl_s=600
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


def airflow_env(home: Path, dags: Path, url: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPUYARD_"))}
    return env | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        "AIRFLOW__TRIGGERER__CAPACITY": "2000",
        "AIRFLOW_CONN_GPUYARD_DEFAULT": json.dumps({"conn_type": "gpuyard", "host": url, "password": token}),
        "PATH": f"{BIN}:{env.get('PATH', '')}",
    }


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=90.0, help="how long the jobs keep changing state")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="CPU measured before any change")
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
    run_s = (args.seconds / 4, args.seconds / 2)
    triggerer, plane = None, None
    database, metadata = store_database(args.postgres, "gpuyard"), store_database(args.postgres, "airflow")
    try:
        plane = ControlPlane(work / "gpuyard", slots=args.tasks, run_s=run_s, database_url=next(database))
        airflow_db = next(metadata)
        token = plane.token("a")
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
        print(f"{len(jobs)} jobs submitted to {plane.url}", flush=True)

        dags, home = work / "dags", work / "airflow"
        dags.mkdir()
        home.mkdir()
        (dags / f"{DAG_ID}.py").write_text(DAG_FILE.format(dag_id=DAG_ID))
        env = airflow_env(home, dags, plane.url, token)
        if args.pace is not None:
            env["AIRFLOW__GPUYARD__FOLLOW_PACE_S"] = str(args.pace)
        if airflow_db:  # psycopg 3 for both of Airflow's engines (its async default wants asyncpg)
            url = airflow_db.replace("postgresql://", "postgresql+psycopg://")
            env |= {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
            }
        airflow = str(BIN / "airflow")
        run([airflow, "db", "migrate"], env)
        run([airflow, "dags", "reserialize"], env)
        (work / "jobs.json").write_text(json.dumps(jobs))
        run([sys.executable, "-c", DEFER.format(dag_id=DAG_ID), str(work / "jobs.json")], env)
        print(f"{args.tasks} task instances deferred to GpuJobTrigger; starting the triggerer", flush=True)

        probe = work / "probe.json"
        if args.attribute:  # the triggerer alone
            path = [str(Path(__file__).resolve().parent / "triggerer_probe"), env.get("PYTHONPATH", "")]
            env |= {"PYTHONPATH": os.pathsep.join(filter(None, path)), "GPUYARD_TRIGGERER_PROBE": str(probe)}
        triggerer = subprocess.Popen(
            [airflow, "triggerer"],
            env=env,
            stdout=(work / "triggerer.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        process = psutil.Process(triggerer.pid)
        logs = home / "logs"
        deadline = time.monotonic() + 600
        while True:
            # Following, and done with its backlog (the job's submission, told from it).
            following = sum(1 for p in logs.rglob("*.log.trigger.*") if ": submitted: " in p.read_text())
            print(f"  {following}/{args.tasks} triggers following", flush=True)
            if following >= args.tasks:
                break
            if time.monotonic() > deadline or triggerer.poll() is not None:
                raise SystemExit(f"the triggerer did not start every trigger; see {work / 'triggerer.log'}")
            time.sleep(5)

        # What following costs while nothing changes: Airflow's own loop over its 1,000 triggers.
        idle_before, idle_start = triggerer_cpu(process), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_after, idle_wall = triggerer_cpu(process), time.monotonic() - idle_start
        idle = {k: idle_after[k] - idle_before[k] for k in idle_after}
        print(
            f"triggerer while no job changes: {sum(idle.values()):.1f}s CPU over {idle_wall:.1f}s "
            f"(supervisor {idle['supervisor']:.1f}s, trigger runner {idle['children']:.1f}s)",
            flush=True,
        )

        observer = Observer(plane.url, plane.admin)
        observer.start()
        cpu_before, wall_before, started_at = triggerer_cpu(process), time.monotonic(), time.time()
        probed_before = read_probe(probe) if args.attribute else {}
        plane.start_scheduling()
        print(
            f"scheduling: every job runs {run_s[0]:.0f}-{run_s[1]:.0f}s, a third preempted once", flush=True
        )
        with httpx.Client(
            base_url=plane.url, headers={"Authorization": f"Bearer {plane.admin}"}, timeout=30
        ) as api:
            while True:  # counted from the event log as the observer reads it: no listing in between
                succeeded = len(observer.succeeded)
                print(f"  {succeeded}/{args.tasks} jobs succeeded", flush=True)
                if succeeded >= args.tasks or time.monotonic() - wall_before > args.seconds * 3:
                    break
                time.sleep(5)
            time.sleep(3)  # the last changes reach the log files
            after, ended_at = triggerer_cpu(process), time.time()
            probed_after = read_probe(probe) if args.attribute else {}
            split = {k: after[k] - cpu_before[k] for k in after}
            cpu, wall = sum(split.values()), time.monotonic() - wall_before
            events = {}
            cursor = 0
            while True:
                page = api.get("/v1/events", params={"after": cursor, "limit": 1000}).json()
                events |= {e["seq"]: e for e in page["events"]}
                if not page["events"]:
                    break
                cursor = page["cursor"]

        holes = max(events) - len(events) if events else 0  # seqs of writes that rolled back
        observer.stop.set()

        # The first wave places every job in one scheduler pass (all stamped at its start); from the
        # moment every job has run once, changes come as jobs end and are preempted, spread in time.
        def stamp(event: dict[str, Any]) -> float:
            return dt.datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()

        first_runs: dict[str, float] = {}
        for event in sorted(events.values(), key=lambda e: e["seq"]):
            if event["type"] == "attempt.running":
                first_runs.setdefault(event["job_id"], stamp(event))
        settled = max(first_runs.values())
        latencies, visible = [], []
        for _job, seq, logged in told_lines(logs):
            event = events[seq]
            at = stamp(event)
            if at > settled:
                latencies.append(logged - at)
                if seq in observer.seen:
                    visible.append(observer.seen[seq] - at)
        latencies.sort()
        visible.sort()
        told = len(latencies)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        v50, v99 = percentile(visible, 0.5), percentile(visible, 0.99)
        print(f"{told} state changes told after the first wave: from the change (its `at`) to the task log,")
        print(f"  p50 {p50:.3f}s p99 {p99:.3f}s max {latencies[-1]:.3f}s")
        print(f"  of which until a reader in the API's own process saw it: p50 {v50:.3f}s p99 {v99:.3f}s")
        print(
            f"triggerer: {cpu:.1f}s CPU over {wall:.1f}s (supervisor {split['supervisor']:.1f}s, "
            f"trigger runner {split['children']:.1f}s)"
        )
        if args.attribute:
            print_attribution(probed_before, probed_after, wall)
        records, size = log_traffic(logs, started_at, ended_at)
        print(
            f"the triggers' logs meanwhile: {records} records, {size / 1024:.0f} KiB "
            f"({size / 1024 / wall:.1f} KiB/s; {size / max(records, 1):.0f} bytes a record)"
        )
        print(f"the event log: {len(events)} events, {holes} seqs never committed (rolled-back writes)")
        print(f"RESULT follow_p99_s={p99:.3f} triggerer_cpu_share={cpu / wall:.3f}")
        return 0
    finally:
        if triggerer is not None and triggerer.poll() is None:
            os.killpg(triggerer.pid, signal.SIGTERM)
            try:
                triggerer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(triggerer.pid, signal.SIGKILL)
        if plane is not None:
            plane.close()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        database.close()
        metadata.close()


if __name__ == "__main__":
    raise SystemExit(main())
