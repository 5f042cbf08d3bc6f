"""What the pipelines' Airflow tasks import, imported once per scheduler instead of once per task.

Airflow's LocalExecutor runs each task in a process forked from one of its workers. Started from a
forkserver that imported this module, every worker, and so every task, begins with these libraries
loaded: a task that validates (Great Expectations), renders features (Feast), reads the registry
(MLflow) or scores a model (torch) no longer spends 1 to 3 CPU seconds importing them first. The
forkserver is a fresh, single-threaded process, so nothing is forked mid-flight of another thread.

`pipelines.demo.PRELOADED_TASKS` are the Airflow settings that turn it on (`make ui` and the test
stacks use them), for the scheduler only: the triggerer and the DAG processor keep Python's default
start method. The operator tests' stack spent 120 CPU-s with it, 143 without (docs/airflow.md).
"""

from __future__ import annotations

import great_expectations  # noqa: F401
import mlflow  # noqa: F401
import pandas  # noqa: F401
import pyarrow.parquet  # noqa: F401
import torch  # noqa: F401
from airflow.sdk.execution_time import supervisor, task_runner  # noqa: F401

from pipelines import features

features.import_feast()
