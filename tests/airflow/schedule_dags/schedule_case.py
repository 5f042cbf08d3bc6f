"""The DAGs of tests/airflow/test_schedule.py, for the definition at $GPUYARD_SCHEDULE_DEFINITION: its
retraining DAG with the production schedule, Params and `start` (the steps after it are left out: the
tests read the window `start` resolved), and its landing check as dags/landings.py builds it."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG

from pipelines import landings
from pipelines import tasks as step
from pipelines.definition import load_definition

PIPELINE = load_definition(os.environ["GPUYARD_SCHEDULE_DEFINITION"])

with DAG(
    dag_id=PIPELINE.name,
    schedule=step.schedule(PIPELINE),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    params=step.params(PIPELINE),
):
    step.start(PIPELINE)

landings.landing_dag(PIPELINE)
