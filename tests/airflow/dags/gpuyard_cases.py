"""DAGs of the operator tests: one GpuTrainingOperator task each, on a tiny training set.

The tests set GPUYARD_CASES_CONFIG (training config), GPUYARD_CASES_CHECKPOINTS (checkpoint root),
GPUYARD_CASES_MLFLOW (tracking URI) and GPUYARD_CASES_TIMEOUT_S (the timeout case's
execution_timeout) for every Airflow process.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG
from gpuyard_provider.operators.training import GpuTrainingOperator

CASES = {
    # name: (deferrable, max_steps, seconds per step)
    "kill-before-store": (True, 10, 0.0),
    "kill-while-following": (False, 40, 0.1),
    "triggerer-restart": (True, 40, 0.1),
    "mark-failed": (True, 100_000, 0.2),
    "token-check": (True, 10, 0.0),
}


def training(name: str, steps: int, **arguments: object) -> GpuTrainingOperator:
    """The cases' GPU training task: a job of team a on the tiny training set."""
    return GpuTrainingOperator(
        task_id="train",
        name=name,
        team="a",
        training_config=os.environ.get("GPUYARD_CASES_CONFIG", "missing.yaml"),
        checkpoint_root=os.environ.get("GPUYARD_CASES_CHECKPOINTS", "file:///tmp/missing"),
        max_steps=steps,
        gpus=1,
        gpu_type="cpu",
        preemptible=True,
        mlflow_tracking_uri=os.environ.get("GPUYARD_CASES_MLFLOW"),
        **arguments,  # type: ignore[arg-type]
    )


for name, (deferrable, steps, step_s) in CASES.items():
    with DAG(
        f"case_{name.replace('-', '_')}", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False
    ):
        training(
            name,
            steps,
            overrides={"train.step_sleep_s": step_s},
            deferrable=deferrable,
            retries=1,
            retry_delay=dt.timedelta(seconds=1),
        )


# execution_timeout caps the job (deferrable from `[operators] default_deferrable`, as the tests'
# Airflow sets it): the trigger ends the wait at the deadline and the job is cancelled.
with DAG("case_execution_timeout", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False):
    training(
        "execution-timeout",
        100_000,
        overrides={"train.step_sleep_s": 0.2},
        execution_timeout=dt.timedelta(seconds=float(os.environ.get("GPUYARD_CASES_TIMEOUT_S", "20"))),
    )


# The approval gate and publication of the retraining DAGs (pipelines/tasks.py) on a registered
# version the test made: the run's conf holds the DAG run's MLflow run and the evaluation's verdict.
if os.environ.get("GPUYARD_CASES_DEFINITION"):
    from airflow.sdk import Param, chain, get_current_context, task

    from pipelines import tasks as step
    from pipelines.definition import load_definition

    PIPELINE = load_definition(os.environ["GPUYARD_CASES_DEFINITION"])

    @task(task_id="start")
    def started() -> dict[str, str]:
        return {"mlflow_run_id": get_current_context()["params"]["mlflow_run_id"]}

    @task(task_id="evaluate")
    def evaluated() -> dict[str, object]:
        return dict(get_current_context()["params"]["verdict"])

    with DAG(
        "case_approval",
        schedule=None,
        start_date=dt.datetime(2026, 1, 1),
        catchup=False,
        params={"mlflow_run_id": Param("", type="string"), "verdict": Param({}, type="object")},
    ):
        run, verdict = started(), evaluated()
        gate = step.approval(PIPELINE)
        published = step.publish(PIPELINE, run, verdict, gate.output)
        chain(verdict, gate, published, *step.promotions(PIPELINE, published))  # approve_/promote_<env>

    # The retraining DAGs' run around a training job: the real `start` (the setup, opening the DAG
    # run's MLflow run) and `finish` (its teardown), and the pipelines' failure callback. The job
    # fails (a data path that does not exist: one attempt, no retry; publication stays behind it)
    # or trains 10 steps.
    def retraining(dag_id: str, overrides: dict[str, object], publishes: bool) -> None:
        with DAG(
            dag_id,
            schedule=None,
            start_date=dt.datetime(2026, 1, 1),
            catchup=False,
            params={**step.params(PIPELINE), "verdict": Param({}, type="object")},
            on_failure_callback=step.report_failure,
        ):
            run = step.start(PIPELINE)
            trained = training(
                dag_id.replace("_", "-"),
                10,
                overrides=overrides,
                max_failures=0,
                mlflow_parent_run_id=step.START.format(field="mlflow_run_id"),
                retries=0,
            )
            work = [trained, step.publish(PIPELINE, run, evaluated()).operator] if publishes else [trained]
            chain(run, *work, step.finish(PIPELINE, run))

    retraining("case_failed_training", {"data.path": "/nonexistent"}, publishes=True)
    retraining("case_cleared_training", {}, publishes=False)
