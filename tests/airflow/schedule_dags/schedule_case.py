"""The DAGs of tests/airflow/test_schedule.py, for the definition at $GPUYARD_SCHEDULE_DEFINITION: its
retraining DAG with the production schedule, Params and `start` (the steps after it are left out: the
tests read the window `start` resolved), and its landing check as dags/landings.py builds it."""

from __future__ import annotations

import os

from airflow.sdk import DAG

from pipelines import landings
from pipelines import tasks as step
from pipelines.definition import load_definition

PIPELINE = load_definition(os.environ["GPUYARD_SCHEDULE_DEFINITION"])

with DAG(**step.retraining_dag(PIPELINE)):
    step.start(PIPELINE)

landings.landing_dag(PIPELINE)
