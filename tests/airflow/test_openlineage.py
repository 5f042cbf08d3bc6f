"""OpenLineage events of the pipeline's tasks (Airflow's OpenLineage provider, a file transport): off
unless a deployment configures a transport; with one, a real `dag.test()` of the pipeline's ingest
and a training task writes events whose datasets chain raw partitions -> prepared tables ->
training set -> model versions, the training run carrying its gpuyard job as a facet."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow_harness import PYTHON, ROOT, airflow_environment, run_python

from pipelines.definition import load_definition

pytestmark = pytest.mark.slow  # Airflow in processes: a DAG run with the OpenLineage listener

JOB = {  # a training job as gpuyard reports it: preempted once, resumed from its checkpoint
    "id": "job-7",
    "state": "SUCCEEDED",
    "attempts": [
        {"state": "PREEMPTED", "checkpoint_step": 100, "step": 130},
        {"state": "SUCCEEDED", "checkpoint_step": None, "step": 200},
    ],
}

# The pipeline's ingest (its task, real data) after a `start` that only hands on the window, and a
# training task: GpuTrainingOperator with the job's outcome as gpuyard would report it (no gpuyard here).
DAG_FILE = """
import datetime as dt
from typing import Any
from airflow.sdk import DAG, task
from gpuyard_provider.operators.training import GpuTrainingOperator
from pipelines import tasks as step
from pipelines.definition import load_definition

PIPELINE = load_definition(%(definition)r)

class ReportedJob(GpuTrainingOperator):
    def execute(self, context: Any) -> Any:
        return self.result_of(%(job)r)

    def _mlflow_run_and_model(self, job_id: str) -> tuple[str, str]:
        return "run-1", "models:/m-0123"

@task(task_id="start")
def start() -> dict[str, Any]:
    window = PIPELINE.window(PIPELINE.data.run_date)
    return {k: str(v) for k, v in window.model_dump().items()}

with DAG("lineage_case", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False) as dag:
    run = start()
    step.ingest(PIPELINE, run) >> ReportedJob(
        task_id="train", name="t", team="a", training_config="c.yaml", image="i", checkpoint_root="file:///c",
        mlflow_tracking_uri=PIPELINE.tracking_uri, overrides={"data.path": %(train_data)r},
    )
"""

# The run's state goes to a file: on stdout, the OpenLineage pool's log lines may land inside its line.
RUN = """
import json, pathlib, sys
from airflow.utils import db
db.initdb()
sys.path.insert(0, %(folder)r)
from lineage_case import dag
run = dag.test()
pathlib.Path(%(result)r).write_text(json.dumps({"state": str(run.state)}))
"""

CHAIN = """
import json
from airflow.providers.openlineage import conf
from airflow.providers.openlineage.plugins.openlineage import OpenLineageProviderPlugin
from openlineage.client.serde import Serde
from gpuyard_provider.operators.training import GpuTrainingOperator
from pipelines import openlineage_events as events
from pipelines.definition import load_definition

definition = load_definition(%(definition)r)
root = definition.data.root
built = {part: {"data_url": f"{root}/training/{part}/data.parquet"} for part in ("train", "holdout")}
train = GpuTrainingOperator(task_id="train", name="t", team="a", training_config="c.yaml", image="i", checkpoint_root="file:///c",
    mlflow_tracking_uri=definition.tracking_uri, overrides={"data.path": built["train"]["data_url"]})
train._mlflow_run_and_model = lambda job_id: ("run-1", "models:/m-0123")
train.result_of(%(job)r)
verdict = {"job_id": "job-7", "candidate": {"version": "3"}, "champion": {"version": "2"}}
steps = {
    "ingest": events.ingest(definition, ["2013-01-20", "2013-01-21"]),
    "prepare": events.prepare(definition, events.days("2013-01-14", "2013-01-21")),
    "prepare_weather": events.prepare(definition, ["2013-01-21"], ["prepare_weather"]),
    "training_set": events.training_set(definition, built),
    "train": train.get_openlineage_facets_on_complete(None),
    "pick_best": events.pick_best(definition, [{"model_uri": "models:/m-0123"}], ["models:/flights-delay/3"]),
    "evaluate": events.evaluate(definition, verdict, built["holdout"]["data_url"]),
    "publish": events.publish(definition, verdict, {"version": "3"}),
}
def dataset(d):
    written = json.loads(Serde.to_json(d))
    return {"namespace": d.namespace, "name": d.name,
            "facets": written.get("inputFacets", written.get("outputFacets"))}
print(json.dumps({
    "disabled": conf.is_disabled(), "listeners": len(OpenLineageProviderPlugin.listeners),
    "steps": {k: {"inputs": [dataset(d) for d in v.inputs], "outputs": [dataset(d) for d in v.outputs],
                  "run": {n: json.loads(Serde.to_json(f)) for n, f in v.run_facets.items()}}
              for k, v in steps.items()},
}))
"""


@pytest.fixture
def definition(tmp_path: Path) -> Path:
    raw = yaml.safe_load(load_definition("flights_delay").path.read_text())
    raw["data"] |= {"root": str(tmp_path / "data"), "history_days": 4, "training_days": 2, "holdout_days": 1}
    raw["mlflow"] = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def names(datasets: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def test_the_steps_datasets_chain_from_raw_partitions_to_the_published_version(
    airflow_env: dict[str, str], definition: Path, tmp_path: Path
) -> None:
    done: Any = run_python(airflow_env, CHAIN % {"definition": str(definition), "job": JOB})
    # the repository's Airflow environments configure no transport: the provider stays off
    assert done["disabled"] is True and done["listeners"] == 0
    steps, data, mlflow = done["steps"], str(tmp_path / "data"), f"sqlite:///{tmp_path / 'mlflow.db'}"

    [flights, weather, *reference] = steps["ingest"]["outputs"]
    assert (flights["namespace"], flights["name"]) == ("file", f"{data}/raw/flights")
    assert [p["dimensions"] for p in flights["facets"]["subset"]["outputCondition"]["partitions"]] == [
        {"date": "2013-01-20"},
        {"date": "2013-01-21"},  # the run's partition
    ]
    assert weather["name"] == f"{data}/raw/weather" and "subset" in weather["facets"]
    assert [r["name"] for r in reference] == [f"{data}/raw/{t}" for t in ("planes", "airlines", "airports")]
    assert all(not r["facets"] for r in reference)  # not dated: the whole table

    raw_read = {d["name"]: d for d in steps["prepare"]["inputs"]}
    assert set(raw_read) <= {d["name"] for d in steps["ingest"]["outputs"]}
    read_days = raw_read[f"{data}/raw/flights"]["facets"]["subset"]["inputCondition"]["partitions"]
    assert [p["identifier"] for p in read_days][::7] == ["date=2013-01-14", "date=2013-01-21"]
    prepared = names(steps["prepare"]["outputs"])
    assert ("file", f"{data}/prepared/labels") in prepared and len(prepared) == 6
    assert names(steps["prepare_weather"]["inputs"]) == [
        ("file", f"{data}/raw/airports"),
        ("file", f"{data}/raw/weather"),
    ]
    assert names(steps["prepare_weather"]["outputs"]) == [("file", f"{data}/prepared/origin_weather")]

    assert sorted(names(steps["training_set"]["inputs"])) == sorted(prepared)
    train_set = ("file", f"{data}/training/train/data.parquet")
    assert names(steps["training_set"]["outputs"]) == [
        train_set,
        ("file", f"{data}/training/holdout/data.parquet"),
    ]

    assert names(steps["train"]["inputs"]) == [train_set]
    assert names(steps["train"]["outputs"]) == [(mlflow, "models/m-0123")]
    facet = steps["train"]["run"]["gpuyard_job"]
    assert facet["_schemaURL"].endswith("GpuyardJobRunFacet.json#/$defs/GpuyardJobRunFacet")
    assert {
        k: facet[k] for k in ("jobId", "state", "attempts", "preemptions", "lostSteps", "mlflowRunId")
    } == {
        "jobId": "job-7",
        "state": "SUCCEEDED",
        "attempts": 2,
        "preemptions": 1,
        "lostSteps": 30,
        "mlflowRunId": "run-1",
    }

    assert names(steps["pick_best"]["inputs"]) == names(steps["train"]["outputs"])
    version = (mlflow, "models/flights-delay/3")
    assert names(steps["pick_best"]["outputs"]) == [version]
    assert names(steps["evaluate"]["inputs"]) == [
        version,
        (mlflow, "models/flights-delay/2"),  # the champion it was scored against
        ("file", f"{data}/training/holdout/data.parquet"),
    ]
    assert names(steps["publish"]["outputs"]) == [version]
    assert steps["publish"]["run"]["gpuyard_job"]["jobId"] == "job-7"


def test_a_dag_run_writes_the_events_to_the_file_transport(definition: Path, tmp_path: Path) -> None:
    events_file = tmp_path / "events.jsonl"
    transport = {"type": "file", "log_file_path": str(events_file), "append": True}
    home, folder = tmp_path / "airflow", tmp_path / "dags"
    home.mkdir()
    folder.mkdir()
    env = airflow_environment(
        home, AIRFLOW__CORE__DAGS_FOLDER=str(folder), AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(transport)
    )
    loaded = load_definition(definition)
    train_data = f"{loaded.data.root}/training/train/data.parquet"
    (folder / "lineage_case.py").write_text(
        DAG_FILE % {"definition": str(definition), "job": JOB, "train_data": train_data}
    )

    # the DAG run's own events are sent from a pool after dag.test() returns, the process waits for them
    ran = subprocess.run(
        [PYTHON, "-c", RUN % {"folder": str(folder), "result": str(tmp_path / "run.json")}],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert json.loads((tmp_path / "run.json").read_text()) == {"state": "success"}, ran.stdout[-4000:]

    written = [json.loads(line) for line in events_file.read_text().splitlines()]
    complete = {e["job"]["name"]: e for e in written if e["eventType"] == "COMPLETE"}
    assert {"lineage_case.ingest", "lineage_case.train", "lineage_case"} <= set(complete)

    ingest = complete["lineage_case.ingest"]
    [flights] = [o for o in ingest["outputs"] if o["name"].endswith("/raw/flights")]
    assert flights["namespace"] == "file" and flights["name"] == f"{tmp_path}/data/raw/flights"
    landed = [
        p["dimensions"]["date"] for p in flights["outputFacets"]["subset"]["outputCondition"]["partitions"]
    ]
    assert landed[-1] == str(loaded.data.run_date)  # the run's raw partition, the look-back before it
    assert landed[0] == str(loaded.window(loaded.data.run_date).raw_start)

    train = complete["lineage_case.train"]
    assert [(i["namespace"], i["name"]) for i in train["inputs"]] == [
        ("file", train_data.removeprefix("file://"))
    ]
    assert [(o["namespace"], o["name"]) for o in train["outputs"]] == [(loaded.tracking_uri, "models/m-0123")]
    facet = train["run"]["facets"]["gpuyard_job"]
    assert (facet["jobId"], facet["attempts"], facet["preemptions"]) == ("job-7", 2, 1)
    assert facet["_schemaURL"].endswith("GpuyardJobRunFacet.json#/$defs/GpuyardJobRunFacet")
    # the task's run is a child of the DAG run's, as Marquez links them
    parent = train["run"]["facets"]["parent"]
    assert (
        parent["job"]["name"] == "lineage_case"
        and parent["run"]["runId"] == complete["lineage_case"]["run"]["runId"]
    )
