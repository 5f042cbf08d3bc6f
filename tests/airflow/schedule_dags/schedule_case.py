"""The DAGs of the scheduled-runs tests (tests/airflow/test_operator_stack.py), for the definition the
test writes beside this file in the stack's DAGs folder: its retraining DAG with the production
schedule, Params and `start` (the steps after it are left out: the tests read the window `start`
resolved), and its landing check as dags/landings.py builds it."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from pipelines import landings
from pipelines import tasks as step
from pipelines.definition import load_definition

PIPELINE = load_definition(Path(__file__).with_name("schedule_case.yaml"))

with DAG(**step.retraining_dag(PIPELINE)):
    step.start(PIPELINE)

landings.landing_dag(PIPELINE)
