"""End to end: the repository's flights_delay DAG on a small slice of real 2013 flights, triggered with
Params through Airflow's REST API in what `make ui` starts (its Airflow, an embedded gpuyard, the
MLflow tracking server), as a person triggers it from the UI, with one injected preemption; then the
tutorial's second pipeline (docs/airflow.md), added from scratch beside it and run by `airflow dags
test` on a gpuyard and an MLflow of its own (make ui, stopped with SIGTERM once the run ended, must have
left nothing of what it started running: a `dags test` must not share Airflow's database with a live
scheduler).

The slice is the definition with fewer days, fewer steps and one CPU slot per job; the DAG file
is the repository's own, pointed at that copy of its definition. Everything lives in a directory
every user may enter, and MLflow is the pipeline's tracking server, as in `make demo`: `gpuyard up`
runs as root, so the training jobs run as team a's user. The tracking server asks for credentials:
the DAG's tasks sign in as the pipeline, the training jobs as team a's MLflow user (its gpuyard
secrets), and a job of team b, with team b's, can read and move nothing of team a's. The tutorial's
pipeline shares flights_delay's data root by design, so its data steps (the shared steps this
module ran for flights_delay just before) are marked done and its own steps run: training set, GPU
job, evaluation, publication.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from airflow_harness import PYTHON, ROOT, airflow_environment
from gpuyard.launchers import worker_env
from gpuyard_client import GpuyardClient, resolve_endpoint
from servers import free_port, open_directory, wait_until
from stack import AIRFLOW, Gpuyard, triggered, written

from pipelines import mlflow_access, storage, tracking_server
from pipelines.definition import HOME_VARIABLE, load_definition
from pipelines.tracking_server import TrackingServer

# a DAG run and a second pipeline
pytestmark = [pytest.mark.slow, pytest.mark.starts_first, pytest.mark.timeout(1800)]

SLICE: dict[str, Any] = {
    "data": {"run_date": "2013-01-12", "history_days": 10, "training_days": 5, "holdout_days": 2},
    "spark": {"shuffle_partitions": 2},
    "job": {"gpus": 1, "max_steps": 60},
    # step_sleep_s: a step of this tiny model takes milliseconds; the preemption must land mid-run
    "training": {
        "train": {"log_every": 10, "step_sleep_s": 0.05},
        "checkpoint": {"interval_steps": 10},
        "model": {"hidden": [16]},
    },
}
DATA_STEPS = "ingest|validate_raw|choose_engine|prepare_.*|validate_features|feast_apply|materialize"


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def sliced(definition_text: str, folder: Path, name: str) -> Path:
    """The definition with the test's slice, written under `folder`; returns its path."""
    raw = merge(yaml.safe_load(definition_text), SLICE)
    path = folder / name / "pipeline.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def dag_file(text: str, name: str, definition: Path, dags: Path) -> None:
    """A pipeline's DAG file, reading the definition at `definition` instead of pipelines/<name>/."""
    needle = f'load_definition("{name}")'
    assert needle in text, f"the DAG file reads its definition with {needle}"
    (dags / f"{name}.py").write_text(text.replace(needle, f'load_definition("{definition}")'))


@dataclass
class Run:
    code: int
    log: str
    env: dict[str, str]

    def xcom(self, dag_id: str, task_id: str, key: str = "return_value") -> Any:
        with sqlite3.connect(Path(self.env["AIRFLOW_HOME"]) / "airflow.db") as conn:
            row = conn.execute(
                "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = ?", (dag_id, task_id, key)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def states(self, dag_id: str) -> dict[str, str]:
        with sqlite3.connect(Path(self.env["AIRFLOW_HOME"]) / "airflow.db") as conn:
            rows = conn.execute(
                "SELECT task_id, map_index, state FROM task_instance WHERE dag_id = ?", (dag_id,)
            ).fetchall()
        return {f"{t}[{m}]" if m >= 0 else t: s for t, m, s in rows}


def dags_test(env: dict[str, str], dag_id: str, *extra: str) -> Run:
    done = subprocess.run(
        [AIRFLOW, "dags", "test", dag_id, *extra],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    return Run(done.returncode, done.stdout + done.stderr, env)


@dataclass
class World:
    root: Path
    gpuyard: Gpuyard
    env: dict[str, str]
    dags: Path
    flights: Run
    preempted: str | None
    mlflow_url: str
    team_b_token: str


@pytest.fixture(scope="module")
def world(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[World]:
    from pipelines.demo import Preemption

    with open_directory("gpuyard-e2e-") as root, contextlib.ExitStack() as started:
        monkeypatch_module.setenv(HOME_VARIABLE, str(root))  # the definitions' data roots, here too
        dags = root / "dags"
        dags.mkdir()
        definition = sliced(
            load_definition("flights_delay").path.read_text(), root / "definitions", "flights_delay"
        )
        dag_file((ROOT / "dags" / "flights_delay.py").read_text(), "flights_delay", definition, dags)
        data = Path(storage.local_path(load_definition(definition).data.root))  # the tutorial's too
        (root / "airflow").mkdir()
        ports = {name: free_port() for name in ("airflow", "gpuyard", "mlflow")}
        pipeline = tracking_server.stored_credentials(data, mlflow_access.PIPELINE)
        teams = {t: tracking_server.stored_credentials(data, mlflow_access.team_user(t)) for t in ("a", "b")}
        for name, value in pipeline.env().items():  # this process reads as the pipeline
            monkeypatch_module.setenv(name, value)
        with MakeUi(root, dags, ports) as ui:
            mlflow_url = f"http://127.0.0.1:{ports['mlflow']}"
            admin_credentials = tracking_server.stored_credentials(data, mlflow_access.ADMIN)
            mlflow_access.provision(mlflow_url, admin_credentials, pipeline, teams)
            admin = started.enter_context(
                GpuyardClient(resolve_endpoint(url=ui.gpuyard.url, token=ui.gpuyard.admin_token))
            )
            team_b = ui.gpuyard.mint("b")  # a team exists once it has a token
            for team, credentials in teams.items():
                mlflow_access.hand_to_team(admin, team, credentials)
            preemption = Preemption(admin)
            preemption.start()
            started.callback(preemption.stop.set)
            flights = ui.run("flights_delay", PARAMS)
            preemption.stop.set()
        # The checks below run on a gpuyard and an MLflow of their own, on the same homes: the tutorial's
        # `airflow dags test` must not share Airflow's database with make ui's live scheduler and triggerer.
        (root / "gpuyard" / "server.json").unlink(missing_ok=True)
        gpuyard = Gpuyard(root / "gpuyard", slots=2).start()
        started.callback(gpuyard.stop)
        tracking = started.enter_context(TrackingServer(data, root / "mlflow.log"))
        monkeypatch_module.setenv("MLFLOW_TRACKING_URI", tracking.url)  # the definitions' store
        connection = {"conn_type": "gpuyard", "host": gpuyard.url, "password": gpuyard.token}
        env = airflow_environment(
            root / "airflow",
            AIRFLOW__CORE__DAGS_FOLDER=str(dags),
            AIRFLOW_CONN_GPUYARD_DEFAULT=json.dumps(connection),
            MLFLOW_TRACKING_URI=tracking.url,
            **pipeline.env(),
            **{HOME_VARIABLE: str(root)},
        )
        yield World(root, gpuyard, env, dags, flights, preemption.attempt, tracking.url, team_b)


# What a person sets in the trigger form: more steps than the definition's, so the test sees the
# Params reach the training jobs (and the injected preemption lands mid-run).
PARAMS = {"max_steps": 80, "gpus": 1, "preemptible": False}


class MakeUi:
    """`make ui` (pipelines/ui.py) on the test's demo home and DAGs folder: its own `gpuyard up`, MLflow
    tracking server and `airflow standalone`, as a person starts them after `make demo`. Leaving the
    context SIGTERMs it, and nothing it started may be left running."""

    def __init__(self, root: Path, dags: Path, ports: dict[str, int]) -> None:
        self.root, self.dags, self.ports = root, dags, ports
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{ports['airflow']}/api/v2", timeout=120)

    def __enter__(self) -> MakeUi:
        subprocess.run(  # what `make demo` leaves: Airflow's database
            [AIRFLOW, "db", "migrate"],
            env=airflow_environment(self.root / "airflow"),
            check=True,
            capture_output=True,
        )
        env = env_without_ours() | {
            "GPUYARD_DEMO_HOME": str(self.root),
            "GPUYARD_DEMO_DAGS": str(self.dags),
            **{f"{name.upper()}_UI_PORT": str(port) for name, port in self.ports.items()},
        }
        self.process = subprocess.Popen(
            [PYTHON, "-m", "pipelines.ui"],
            env=env,
            cwd=ROOT,
            stdout=(self.root / "make-ui.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            home = self.root / "gpuyard"
            try:
                wait_until(self._serves, 240, 0.5, what="make ui's Airflow, gpuyard and MLflow")
            except AssertionError as late:  # which of the three did not come up, and why
                raise AssertionError(f"{late}\n{self._logs()}") from None
            self.gpuyard = Gpuyard(home)
            self.gpuyard.url = json.loads((home / "server.json").read_text())["url"]
            self.gpuyard.admin_token = (home / "admin.token").read_text().strip()
            self.gpuyard.token = self.gpuyard.mint("a")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _logs(self, lines: int = 40) -> str:
        """The end of make ui's own log and of each log of what it started."""
        logs = [self.root / "make-ui.log", *sorted((self.root / "ui-logs").glob("*.log"))]
        return "\n".join(
            f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in logs
            if log.exists()
        )

    def _serves(self) -> bool:
        assert self.process.poll() is None, self._logs()
        urls = (
            f"http://127.0.0.1:{self.ports['mlflow']}/health",
            f"http://127.0.0.1:{self.ports['airflow']}/api/v2/monitor/health",
        )
        with contextlib.suppress(httpx.HTTPError):
            served = all(self.api.get(url, timeout=2).status_code == 200 for url in urls)
            return served and self.api.get("/dags/flights_delay").status_code == 200
        return False

    def run(self, dag_id: str, params: dict[str, Any]) -> Run:
        """Unpause the DAG and trigger a run with `params` through Airflow's REST API, as the UI's
        trigger form does; the run's outcome once it ended."""
        assert written(self.api, "PATCH", f"/dags/{dag_id}", {"is_paused": False}).status_code == 200
        now = dt.datetime.now(dt.UTC).isoformat()
        run_id = triggered(self.api, dag_id, {"logical_date": now, "conf": params})

        def ended() -> str | None:
            # Under the suite's load the API server may answer late (SQLite's writers queue behind the
            # scheduler's): a late answer says nothing about the run, the next poll asks again.
            try:
                state = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
            except httpx.TimeoutException:
                return None
            return state if state in ("success", "failed") else None

        state = wait_until(ended, 1200, 1.0, what=f"the triggered run of {dag_id}")
        folder = self.root / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        logs = "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*.log*")) if p.is_file())
        env = airflow_environment(self.root / "airflow")
        return Run(0 if state == "success" else 1, f"DAG run {run_id}: {state}\n{logs}", env)

    def __exit__(self, *_: object) -> None:
        self.api.close()
        self.process.send_signal(signal.SIGTERM)  # as `kill` would: make ui stops what it started
        code = self.process.wait(timeout=60)
        left = [p for p in psutil.process_iter() if self._started_by_ui(p)]
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        assert code == 0 and not left, f"make ui exited {code} and left {left} running"

    def _started_by_ui(self, process: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return process.pid != os.getpid() and process.environ().get(HOME_VARIABLE) == str(self.root)
        return False


def env_without_ours() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "AIRFLOW", "MLFLOW_"))}


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_dag_runs_end_to_end_and_publishes_a_champion(world: World) -> None:
    run = world.flights
    assert run.code == 0, run.log[-5000:]  # the run triggered in make ui's Airflow, with Params
    states = run.states("flights_delay")
    # the slice is small: `engine: auto` prepares it with pandas, the Spark jobs are skipped
    assert {t for t, s in states.items() if s == "skipped"} == {
        "prepare_flights",
        "prepare_weather",
        "prepare_planes",
    }
    assert set(states.values()) == {"success", "skipped"}, states
    assert states["training_serving_parity"] == "success"  # publication waited for it
    assert {"train[0]", "train[1]"} <= set(states)  # one job per grid entry
    definition = load_definition(world.root / "definitions" / "flights_delay" / "pipeline.yaml")
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(definition.tracking_uri)
    champion = mlflow.get_model_version_by_alias("flights-delay", "champion")
    best = run.xcom("flights_delay", "pick_best")
    assert str(champion.version) == best["model_uri"].rsplit("/", 1)[-1]
    assert champion.tags["airflow.dag_id"] == "flights_delay"
    assert champion.tags["gpuyard.job_id"] == best["job_id"]
    verdict = run.xcom("flights_delay", "evaluate")
    assert verdict["promote"] and verdict["champion"] is None and 0.5 < verdict["candidate"]["value"] <= 1.0


def test_lineage_walks_back_from_the_model_version(world: World) -> None:
    definition = load_definition(world.root / "definitions" / "flights_delay" / "pipeline.yaml")
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(definition.tracking_uri)
    version = mlflow.get_model_version_by_alias("flights-delay", "champion")
    training = mlflow.get_run(version.run_id)  # the version's run is the training run ...
    parent = mlflow.get_run(training.data.tags["mlflow.parentRunId"])  # ... the DAG run's run its parent
    assert version.tags["mlflow.parent_run_id"] == parent.info.run_id
    tags = parent.data.tags
    assert tags["airflow.dag_id"] == "flights_delay" and tags["airflow.run_id"].startswith("manual__")
    assert tags["airflow.logical_date"] and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", tags["git.commit"])
    assert tags["pipeline.definition_sha256"] == definition.digest
    assert parent.info.status == "FINISHED" and "candidate_roc_auc" in parent.data.metrics
    sets = world.flights.xcom("flights_delay", "training_set")
    child = training.data.tags
    assert child["gpuyard.job_id"] == version.tags["gpuyard.job_id"]
    assert child["training_set.manifest_sha256"] == sets["train"]["manifest_sha256"]
    assert (child["feature_service.name"], child["feature_service.version"]) == ("flight_delay_v1", "1")
    assert {"gpuyard.attempts", "gpuyard.preemptions", "gpuyard.progress_lost_steps_total"} <= set(child)
    [learned_from] = training.inputs.dataset_inputs  # the training set, MLflow's input dataset of the run
    assert learned_from.dataset.digest == sets["train"]["manifest_sha256"][:36]
    assert learned_from.dataset.name == "flights_delay/training_set"
    assert {tag.key: tag.value for tag in learned_from.tags}["mlflow.data.context"] == "training"


def test_the_training_job_record_shows_the_injected_preemption_and_the_resume(world: World) -> None:
    assert world.preempted, "no attempt was preempted"
    job_id = world.preempted.rsplit("-", 2)[0]  # <job id>-a<number>-<hex>; job ids may hold "-a"
    job = world.gpuyard.job(job_id)
    assert job["state"] == "SUCCEEDED"
    first, second = job["attempts"]
    assert (first["state"], second["state"]) == ("PREEMPTED", "SUCCEEDED")
    assert second["step"] == PARAMS["max_steps"]  # the trigger form's Params reached the job
    assert first["checkpoint_step"] > 0  # it saved on the notice ...
    assert (
        f"attempt 2 running, resuming from the checkpoint at step {first['checkpoint_step']}"
        in world.flights.log
    )
    assert job["failures"] == 0  # ... and the preemption cost no retry budget
    from mlflow.tracking import MlflowClient

    definition = load_definition(world.root / "definitions" / "flights_delay" / "pipeline.yaml")
    mlflow = MlflowClient(definition.tracking_uri)
    [run] = mlflow.search_runs(
        [e.experiment_id for e in mlflow.search_experiments()],
        filter_string=f"tags.`gpuyard.job_id` = '{job_id}'",
    )
    assert (run.data.tags["gpuyard.attempts"], run.data.tags["gpuyard.preemptions"]) == ("2", "1")


def test_the_training_jobs_ran_as_team_a_s_user_and_mlflow_s_files_are_the_server_s(world: World) -> None:
    identities = json.loads((world.gpuyard.home / "attempts" / worker_env.IDENTITIES_FILE).read_text())
    data = Path(
        storage.local_path(
            load_definition(world.root / "definitions" / "flights_delay" / "pipeline.yaml").data.root
        )
    )
    for shared in (data / "checkpoints", data / "train"):  # made by the pipeline, open to every team
        assert (shared.stat().st_uid, stat.S_IMODE(shared.stat().st_mode)) == (os.getuid(), 0o1777)
        jobs = list(shared.iterdir())  # one folder per training job, made by its worker
        assert len(jobs) == 2 and {p.stat().st_uid for p in jobs} == {identities["a"]}, jobs
        assert {stat.S_IMODE(p.stat().st_mode) for p in jobs} == {0o700}
    stored = [p for p in (data / "mlartifacts").rglob("*") if p.is_file()]
    assert any(p.name == "MLmodel" for p in stored), stored  # the models the jobs logged, over HTTP
    assert {p.stat().st_uid for p in [data / "mlflow.db", *stored]} == {os.getuid()}
    # and for its user only: the data root is open to every team's worker, the tracking server's files not
    closed = [data / "mlflow.db", data / "mlartifacts", data / "mlflow-auth", *stored]
    assert {stat.S_IMODE(p.stat().st_mode) & 0o077 for p in closed} == {0}, closed


# Team b's job, with team b's MLflow credentials (its gpuyard secrets, by reference), against team a's
# experiment, run and model: argv is the tracking server, the experiment, the run, the model, the
# version the champion alias does not name, and the server's store file. One line per try.
TEAM_B_PROBE = """
import json, os, sys
import httpx
url, experiment, run, model, other, store = sys.argv[1:]
http = httpx.Client(base_url=url, timeout=60, auth=(os.environ["MLFLOW_TRACKING_USERNAME"],
                                                    os.environ["MLFLOW_TRACKING_PASSWORD"]))
api = "/api/2.0/mlflow"
def probe(what, response):
    body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    print("PROBE", json.dumps({"what": what, "status": response.status_code, "body": body}))
print("PROBE", json.dumps({"what": "user", "status": 0, "body": os.environ["MLFLOW_TRACKING_USERNAME"]}))
probe("experiments", http.post(f"{api}/experiments/search", json={"max_results": 100}))
probe("search runs", http.post(f"{api}/runs/search", json={"experiment_ids": [experiment]}))
probe("get run", http.get(f"{api}/runs/get", params={"run_id": run}))
probe("set alias", http.post(f"{api}/registered-models/alias",
                             json={"name": model, "alias": "champion", "version": other}))
probe("new alias", http.post(f"{api}/registered-models/alias",
                             json={"name": model, "alias": "team-b", "version": other}))
probe("delete alias", http.request("DELETE", f"{api}/registered-models/alias",
                                   json={"name": model, "alias": "champion"}))
probe("new version", http.post(f"{api}/model-versions/create",
                               json={"name": model, "source": f"runs:/{run}/model", "run_id": run}))
try:
    open(store, "rb").read(16)
    print("PROBE", json.dumps({"what": "store file", "status": 200, "body": {}}))
except PermissionError:
    print("PROBE", json.dumps({"what": "store file", "status": 403, "body": {}}))
"""


def test_team_b_s_job_can_neither_read_team_a_s_runs_nor_move_any_alias(world: World) -> None:
    from mlflow.tracking import MlflowClient

    definition = load_definition(world.root / "definitions" / "flights_delay" / "pipeline.yaml")
    mlflow = MlflowClient(definition.tracking_uri)  # as the pipeline
    champion = mlflow.get_model_version_by_alias("flights-delay", "champion")
    versions = mlflow.search_model_versions("name = 'flights-delay'")
    [other] = [v.version for v in versions if v.version != champion.version]  # the grid's other candidate
    experiment = mlflow.get_run(champion.run_id).info.experiment_id
    store = Path(storage.local_path(definition.data.root)) / "mlflow.db"
    args = [world.mlflow_url, experiment, champion.run_id, "flights-delay", str(other), str(store)]
    spec = {
        "name": "mlflow-probe",
        "team": "b",
        "image": "local",
        "command": ["python", "-c", TEAM_B_PROBE, *args],
        "env_from_secret": mlflow_access.SECRET_ENV,
        "resources": {"gpus": 1},
        "retry": {"max_failures": 0},
    }
    with world.gpuyard.client(world.team_b_token) as http:
        response = http.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        ended = wait_until(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] in ("SUCCEEDED", "FAILED"),
            timeout_s=120,
            what="team b's probe",
        )
        assert ended and http.get(f"/v1/jobs/{job_id}").json()["state"] == "SUCCEEDED"
        lines = http.get(f"/v1/jobs/{job_id}/logs").text.splitlines()
    said = [json.loads(line.split("PROBE ", 1)[1]) for line in lines if "PROBE " in line]
    tries = {t["what"]: t for t in said}
    assert tries["user"]["body"] == "team-b"  # its own credentials reached it, by reference
    assert tries["experiments"]["status"] == 200  # signed in: a user, and one that sees ...
    seen = tries["experiments"]["body"].get("experiments", [])
    assert experiment not in [e["experiment_id"] for e in seen]
    assert tries["search runs"]["body"].get("runs", []) == []  # ... none of team a's runs
    allowed = ("user", "experiments", "search runs")
    refused = {what: t["status"] for what, t in tries.items() if what not in allowed}
    assert refused == dict.fromkeys(refused, 403) and len(refused) == 6, tries
    after = mlflow.get_registered_model("flights-delay")
    assert after.aliases == {"champion": champion.version}, after.aliases  # nothing moved
    assert len(mlflow.search_model_versions("name = 'flights-delay'")) == len(versions)


TUTORIAL_FILE = re.compile(r"<!-- tutorial: (\S+) -->\n```\w+\n(.*?)```", re.DOTALL)


def test_the_tutorial_adds_a_second_pipeline_from_scratch(world: World) -> None:
    files = dict(TUTORIAL_FILE.findall((ROOT / "docs" / "airflow.md").read_text()))
    [definition_name] = [f for f in files if f.endswith("pipeline.yaml")]
    [dag_name] = [f for f in files if f.startswith("dags/")]
    name = Path(dag_name).stem
    assert definition_name == f"pipelines/{name}/pipeline.yaml"
    assert not (ROOT / definition_name).exists() and not (ROOT / dag_name).exists()  # an addition
    definition = sliced(files[definition_name], world.root / "definitions", name)
    dag_file(files[dag_name], name, definition, world.dags)

    run = dags_test(world.env, name, "--mark-success-pattern", DATA_STEPS)
    assert run.code == 0 and "DagRun Finished" in run.log, run.log[-5000:]
    states = run.states(name)
    assert set(states.values()) == {"success"}, states
    tutorial = load_definition(definition)
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(tutorial.tracking_uri)
    champion = mlflow.get_model_version_by_alias(tutorial.promotion.model, "champion")
    assert champion.tags["airflow.dag_id"] == name
    assert mlflow.get_model_version_by_alias("flights-delay", "champion")  # the first pipeline's stays


# The second pipeline of another kind on small data: three weeks of Seattle's weather, one training job.
FORECAST_SLICE: dict[str, Any] = {
    "data": {"run_date": "2013-03-31", "history_days": 24, "training_days": 16, "holdout_days": 7},
    "job": {"max_steps": 40, "grid": [{}]},
    "training": {"train": {"log_every": 10}, "checkpoint": {"interval_steps": 20}},
    # 16 days of March to learn from cannot forecast the warmer end of the month well (a mean absolute
    # error near 8 C, where a year's data gives about 2): the bar here only says the forecast is in
    # degrees C (a probability would miss the holdout's 13-21 C by more than 12)
    "promotion": {"threshold": 12.0},
}


def test_a_pipeline_of_another_kind_runs_end_to_end(world: World) -> None:
    name = "seattle_temperature"
    raw = merge(yaml.safe_load(load_definition(name).path.read_text()), FORECAST_SLICE)
    definition = world.root / "definitions" / name / "pipeline.yaml"
    definition.parent.mkdir(parents=True)
    definition.write_text(yaml.safe_dump(raw, sort_keys=False))
    dag_file((ROOT / "dags" / f"{name}.py").read_text(), name, definition, world.dags)

    run = dags_test(world.env, name)
    assert run.code == 0 and "DagRun Finished" in run.log, run.log[-5000:]
    states = run.states(name)
    verdict = run.xcom(name, "evaluate")  # the forecast's mean absolute error, in degrees C
    # land, check, prepare, Feast, train, evaluate, publish
    assert set(states.values()) == {"success"}, f"{states}; {verdict}"
    assert "prepare_pandas" in states and "train[0]" in states
    forecast = load_definition(definition)
    sets = run.xcom(name, "training_set")
    manifest = json.loads(Path(storage.local_path(sets["train"]["manifest_url"])).read_text())
    assert (manifest["source"], manifest["label_column"], manifest["row_count"]) == (
        "seattle_weather",
        "next_temp_max",
        16,
    )
    assert (
        manifest["positive_rate"] is None and manifest["feature_service"]["name"] == "temperature_forecast_v1"
    )
    assert verdict["metric"] == "mae" and verdict["promote"] and 0.0 < verdict["candidate"]["value"] <= 12.0
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(forecast.tracking_uri)
    champion = mlflow.get_model_version_by_alias("seattle-temperature", "champion")
    assert champion.version == verdict["candidate"]["version"] and champion.tags["airflow.dag_id"] == name
    assert mlflow.get_model_version_by_alias("flights-delay", "champion")  # the first pipeline's stays
