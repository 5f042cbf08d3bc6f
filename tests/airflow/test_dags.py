"""The DAG folder imports with no errors, and each DAG is what its definition says: task order,
schedule, Assets, Params, the mapped training task."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from airflow_harness import ROOT, run_python

from pipelines.definition import load_definition

pytestmark = pytest.mark.slow  # Airflow's DAG processor and `dags test`

SHAPE = """
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
before = dict(os.environ)
bags = [DagBag(dag_folder=folder) for folder in %r]
written = sorted(k for k, v in os.environ.items() if before.get(k) != v)
heavy = ("pandas", "pyarrow", "pyspark", "feast", "mlflow", "great_expectations", "torch", "sklearn", "s3fs")
loaded = sorted(name for name in heavy if name in sys.modules)
dags = {}
for dag_id, dag in [pair for bag in bags for pair in bag.dags.items()]:
    timetable = dag.timetable
    dags[dag_id] = {
        "tasks": {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
        "mapped": sorted(t.task_id for t in dag.tasks if type(t).__name__ == "MappedOperator"),
        "schedule": type(timetable).__name__,
        "cron": getattr(timetable, "expression", None),
        "partition_key_format": getattr(timetable, "key_format", None),
        "assets": sorted(a.uri for a in getattr(condition, "objects", [condition]))
            if (condition := getattr(timetable, "asset_condition", None)) else [],
        "inlets": {t.task_id: [i.name for i in t.inlets] for t in dag.tasks if getattr(t, "inlets", None)},
        "outlets": {t.task_id: [o.name for o in t.outlets] for t in dag.tasks if getattr(t, "outlets", None)},
        "approvals": {t.task_id: {"options": t.options, "defaults": t.defaults, "subject": t.subject,
            "timeout_s": t.response_timeout and t.response_timeout.total_seconds()}
            for t in dag.tasks if type(t).__name__ == "HITLOperator"},
        "params": {k: dag.params.get_param(k).value for k in dag.params},
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "setups": sorted(t.task_id for t in dag.tasks if t.is_setup),
        "teardowns": sorted(t.task_id for t in dag.tasks if t.is_teardown),
        # Airflow's leaves for the run's state: a task followed by teardowns only, not a teardown
        "leaves": sorted(t.task_id for t in dag.tasks if not t.is_teardown
            and all(dag.get_task(d).is_teardown for d in t.downstream_task_ids)),
        "on_failure": getattr(dag.on_failure_callback, "__name__", None),
        "train": {k: v for k, v in getattr(dag.task_dict.get("train"), "partial_kwargs", {}).items()
            if k in ("gpus", "gpu_type", "priority", "preemptible", "max_steps", "new_job")},
    }
errors = {path: error for bag in bags for path, error in bag.import_errors.items()}
print(json.dumps({"errors": errors, "dags": dags, "written": written, "loaded": loaded}, default=str))
"""


# A pipeline with three environments: publication then its promotions, as a DAG file wires them.
ENVIRONMENTS = [
    {"name": "staging", "alias": "staging"},
    {"name": "qa", "alias": "qa", "requires_approval": False},
    {"name": "production", "alias": "production", "registry": "sqlite:///production.db"},
]
PROMOTIONS = """
import datetime as dt
from airflow.sdk import DAG, chain
from pipelines import tasks as step
from pipelines.definition import load_definition

PIPELINE = load_definition(%r)
with DAG("promotions", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False):
    run = step.start(PIPELINE)
    published = step.publish(PIPELINE, run, {"promote": False})
    chain(published, *step.promotions(PIPELINE, published), step.finish(PIPELINE, run))
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from airflow_harness import airflow_environment

    home = tmp_path_factory.mktemp("airflow")
    promotions = tmp_path_factory.mktemp("promotions")
    raw = yaml.safe_load(load_definition("flights_delay").path.read_text())
    raw["promotion"] = {"model": "m", "environments": ENVIRONMENTS}
    (promotions / "pipeline.yaml").write_text(yaml.safe_dump(raw))
    (promotions / "promotions.py").write_text(PROMOTIONS % str(promotions / "pipeline.yaml"))
    report = run_python(airflow_environment(home), SHAPE % [str(ROOT / "dags"), str(promotions)])
    assert isinstance(report, dict)
    return report


def test_the_dag_folder_imports_with_no_errors(folder: dict[str, Any]) -> None:
    assert folder["errors"] == {}
    assert "flights_delay" in folder["dags"]


def test_parsing_the_dag_folder_writes_nothing_to_the_environment(folder: dict[str, Any]) -> None:
    assert folder["written"] == []  # the Spark jobs define their connection as they run


def test_parsing_the_dag_folder_imports_no_data_library(folder: dict[str, Any]) -> None:
    """The dag-processor parses each file, and every task's process parses its DAG's again: the data
    libraries load in the steps that use them (pandas alone cost 0.5 s of CPU a task here)."""
    assert folder["loaded"] == []


def test_flights_delay_hands_its_params_to_the_training_job_by_argument(folder: dict[str, Any]) -> None:
    arguments = ("gpus", "gpu_type", "priority", "preemptible", "max_steps", "new_job")
    assert folder["dags"]["flights_delay"]["train"] == {a: f"{{{{ params.{a} }}}}" for a in arguments}


def test_flights_delay_runs_its_steps_in_order(folder: dict[str, Any]) -> None:
    tasks = folder["dags"]["flights_delay"]["tasks"]
    order = [
        ("start", "ingest"),
        ("ingest", "validate_raw"),
        ("validate_raw", "reprepare_corrections"),  # what corrected raw days reach
        ("reprepare_corrections", "choose_engine"),  # spark.engine: auto
        ("choose_engine", "prepare_flights"),
        ("choose_engine", "prepare_weather"),
        ("choose_engine", "prepare_planes"),
        ("choose_engine", "prepare_pandas"),
        ("prepare_flights", "validate_features"),
        ("prepare_pandas", "validate_features"),
        ("validate_features", "feast_apply"),
        ("feast_apply", "materialize"),
        ("materialize", "training_set"),
        ("training_set", "validate_training_set"),
        ("validate_training_set", "train"),
        ("grid", "train"),
        ("train", "pick_best"),
        ("pick_best", "evaluate"),
        ("evaluate", "publish"),
        ("materialize", "training_serving_parity"),
        ("pick_best", "training_serving_parity"),
        ("training_serving_parity", "publish"),
        ("publish", "finish"),
    ]
    for upstream, downstream in order:
        assert upstream in tasks[downstream], f"{upstream} must run before {downstream}"
    assert "approve" not in tasks  # the definition asks for no approval
    assert folder["dags"]["flights_delay"]["mapped"] == ["train"]


def test_seattle_temperature_runs_the_shared_steps_on_its_own_source(folder: dict[str, Any]) -> None:
    dag = folder["dags"]["seattle_temperature"]
    tasks = dag["tasks"]
    order = [
        ("start", "ingest"),
        ("ingest", "validate_raw"),
        ("validate_raw", "prepare_pandas"),  # spark.engine: pandas, no branch, no Spark job
        ("prepare_pandas", "validate_features"),
        ("validate_features", "feast_apply"),
        ("feast_apply", "materialize"),
        ("materialize", "training_set"),
        ("training_set", "validate_training_set"),
        ("validate_training_set", "train"),
        ("train", "pick_best"),
        ("pick_best", "evaluate"),
        ("evaluate", "publish"),
        ("publish", "finish"),
    ]
    for upstream, downstream in order:
        assert upstream in tasks[downstream], f"{upstream} must run before {downstream}"
    assert not {"choose_engine", "prepare_flights", "reprepare_corrections", "training_serving_parity"} & set(
        tasks
    )
    root = load_definition("seattle_temperature").data.root
    assert [uri.rstrip("/") for uri in dag["assets"]] == [f"{root}/raw/observations"]
    assert dag["outlets"]["publish"] == ["seattle-temperature@champion"]
    landings = folder["dags"]["seattle_temperature_landings"]
    assert landings["outlets"] == {"announce": ["seattle_temperature/raw/observations"]}


def test_flights_delay_s_run_state_is_its_work_s_and_a_failure_is_reported(folder: dict[str, Any]) -> None:
    dag = folder["dags"]["flights_delay"]
    # start opens the MLflow run, finish closes it whatever happened, and decides nothing
    assert dag["setups"] == ["start"] and dag["teardowns"] == ["finish"]
    assert dag["leaves"] == ["publish"]  # a failed training leaves it upstream_failed: the run fails
    assert dag["on_failure"] == "report_failure"


def test_flights_delay_schedule_assets_and_params_are_the_definitions(folder: dict[str, Any]) -> None:
    dag = folder["dags"]["flights_delay"]
    definition = load_definition("flights_delay")
    # one run per announced raw partition; the definition's schedule is its landing check's
    assert dag["schedule"] == "PartitionedAssetTimetable" and dag["cron"] is None
    assert dag["catchup"] is False and dag["max_active_runs"] == 1
    assert [uri.rstrip("/") for uri in dag["assets"]] == [f"{definition.data.root}/raw/flights"]
    assert dag["outlets"] == {"publish": ["flights-delay@champion"]}  # one environment: no promotion
    assert dag["approvals"] == {}
    assert dag["params"] == {
        "run_date": "2013-01-21",
        "max_steps": definition.job.max_steps,
        "gpus": definition.job.gpus,
        "gpu_type": "cpu",
        "priority": "normal",
        "preemptible": True,
        "new_job": False,
    }


def test_flights_delay_s_landing_check_runs_on_its_schedule_and_announces_on_its_raw_asset(
    folder: dict[str, Any],
) -> None:
    dag = folder["dags"]["flights_delay_landings"]  # dags/landings.py, from the definition
    assert dag["tasks"] == {"announce": []}
    assert dag["schedule"] == "CronPartitionTimetable" and dag["cron"] == "0 0 * * *"
    assert dag["partition_key_format"] == "%Y-%m-%d"  # a day, as the landing zone names partitions
    assert dag["catchup"] is False and dag["max_active_runs"] == 1
    raw = ["flights_delay/raw/flights"]
    assert dag["inlets"] == {"announce": raw} and dag["outlets"] == {"announce": raw}


def test_each_later_environment_is_an_approval_then_a_move_with_its_own_asset(folder: dict[str, Any]) -> None:
    dag = folder["dags"]["promotions"]
    tasks = dag["tasks"]
    assert "approve_qa" not in tasks  # qa asks for no approval: it moves on after staging
    assert "publish" in tasks["promote_qa"]
    assert "promote_qa" in tasks["approve_production"]
    assert {"approve_production", "promote_qa"} <= set(tasks["promote_production"])
    assert "promote_production" in tasks["finish"] and dag["teardowns"] == ["finish"]
    assert dag["outlets"] == {
        "publish": ["m@staging"],
        "promote_qa": ["m@qa"],
        "promote_production": ["m@production"],
    }
    [(task_id, approval)] = dag["approvals"].items()
    assert task_id == "approve_production"
    assert approval["options"] == ["Approve", "Reject"] and approval["defaults"] == ["Reject"]
    assert approval["timeout_s"] == 24 * 3600  # unanswered, it rejects: the DAG runs one run at a time
    assert approval["subject"] == (
        "Promote m version {{ ti.xcom_pull(task_ids='promote_qa')['version'] }} from qa to production"
        " (`production` in sqlite:///production.db)?"
    )
