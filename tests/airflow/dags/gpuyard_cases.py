"""DAGs of the operator tests: one GpuTrainingOperator task each, on a tiny training set.

The tests set GPUYARD_CASES_CONFIG (training config), GPUYARD_CASES_CHECKPOINTS (checkpoint root)
and GPUYARD_CASES_MLFLOW (tracking URI) for every Airflow process.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG
from gpuyard.airflow.operators.training import GpuTrainingOperator

CASES = {
    # name: (deferrable, max_steps, seconds per step)
    "kill-before-store": (True, 10, 0.0),
    "kill-while-following": (False, 40, 0.1),
    "triggerer-restart": (True, 40, 0.1),
    "mark-failed": (True, 100_000, 0.2),
}

for name, (deferrable, steps, step_s) in CASES.items():
    with DAG(
        f"case_{name.replace('-', '_')}", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False
    ):
        GpuTrainingOperator(
            task_id="train",
            name=name,
            team="a",
            training_config=os.environ.get("GPUYARD_CASES_CONFIG", "missing.yaml"),
            checkpoint_root=os.environ.get("GPUYARD_CASES_CHECKPOINTS", "file:///tmp/missing"),
            overrides={"train.step_sleep_s": step_s},
            max_steps=steps,
            gpus=1,
            gpu_type="cpu",
            preemptible=True,
            mlflow_tracking_uri=os.environ.get("GPUYARD_CASES_MLFLOW"),
            deferrable=deferrable,
            retries=1,
            retry_delay=dt.timedelta(seconds=1),
        )
