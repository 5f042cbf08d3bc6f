"""MLflow tracking for a training run that may take several attempts: one MLflow run per training run.

The run id travels in every checkpoint manifest; an attempt that finds no checkpoint yet looks the run up by
its `gpuyard.job_id` tag. A resumed attempt reopens that run, counts itself in `gpuyard.attempts` and adds
the steps the previous attempt did after its last checkpoint to `gpuyard.progress_lost_steps`. A run
started with MLFLOW_PARENT_RUN_ID in its environment (set by the Airflow operator to the DAG run's run)
is that run's child.
Only rank 0 talks to MLflow.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.config import MlflowConfig
from training.mlflow_create import create_experiment_once

log = logging.getLogger(__name__)

JOB_TAG = "gpuyard.job_id"
ATTEMPTS_TAG = "gpuyard.attempts"
ATTEMPT_IDS_TAG = "gpuyard.attempt_ids"
LOST_TAG = "gpuyard.progress_lost_steps"
STEP_METRIC = "train_loss"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for a nested run
PARENT_ENV = "MLFLOW_PARENT_RUN_ID"


def tracking_uri(cfg: MlflowConfig, workdir: str, env: Mapping[str, str] = os.environ) -> str:
    return (
        env.get("MLFLOW_TRACKING_URI") or cfg.tracking_uri or f"sqlite:///{Path(workdir).resolve()}/mlflow.db"
    )


class Tracker:
    """No-op tracker: the interface, used on ranks other than 0 and when MLflow is disabled."""

    run_id: str | None = None

    def start(self, resume_run_id: str | None, resumed_step: int) -> str | None:
        return None

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_model(self, model: torch.nn.Module, example: torch.Tensor) -> None:
        pass

    def end(self, status: str) -> None:
        pass


class MlflowTracker(Tracker):
    def __init__(self, cfg: MlflowConfig, workdir: str, job_id: str | None, attempt_id: str | None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.mlflow = mlflow
        self.cfg = cfg
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.uri = tracking_uri(cfg, workdir)
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        if experiment is None:
            location = cfg.artifact_location
            if location is None and not self.uri.startswith(("http://", "https://")):
                # A local store would put them in ./mlruns of the working directory: keep them beside
                # the run's files. A tracking server places them itself (its object store, through
                # --serve-artifacts): a path here would be inside the worker's pod, lost with it.
                location = Path(workdir, "mlartifacts").resolve().as_uri()
            self.experiment_id = create_experiment_once(self.client, cfg.experiment, location)
        else:
            self.experiment_id = experiment.experiment_id

    def _find_by_job(self) -> str | None:
        if not self.job_id:
            return None
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{JOB_TAG}` = '{self.job_id}'",
            order_by=["attributes.start_time ASC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def _last_logged_step(self, run_id: str) -> int | None:
        history = self.client.get_metric_history(run_id, STEP_METRIC)
        return max((m.step for m in history), default=None)

    def start(self, resume_run_id: str | None, resumed_step: int) -> str | None:
        run_id = resume_run_id or self._find_by_job()
        if self.cfg.system_metrics:
            from mlflow.system_metrics import (
                set_system_metrics_samples_before_logging,
                set_system_metrics_sampling_interval,
            )

            set_system_metrics_sampling_interval(self.cfg.system_metrics_interval_s)
            set_system_metrics_samples_before_logging(1)
        if run_id is None:
            active = self.mlflow.start_run(
                experiment_id=self.experiment_id,
                run_name=self.cfg.run_name,
                log_system_metrics=self.cfg.system_metrics,
            )
            tags = {ATTEMPTS_TAG: "1", LOST_TAG: "0", ATTEMPT_IDS_TAG: self.attempt_id or ""}
            if self.job_id:
                tags[JOB_TAG] = self.job_id
            if os.environ.get(PARENT_ENV):
                tags[PARENT_TAG] = os.environ[PARENT_ENV]
            self.mlflow.set_tags(tags)
        else:
            previous = self.client.get_run(run_id).data.tags
            last = self._last_logged_step(run_id)
            lost = max(0, (last or 0) - resumed_step)
            active = self.mlflow.start_run(run_id=run_id, log_system_metrics=self.cfg.system_metrics)
            ids = [i for i in previous.get(ATTEMPT_IDS_TAG, "").split(",") if i]
            if self.attempt_id:
                ids.append(self.attempt_id)
            tags = {
                ATTEMPTS_TAG: str(int(previous.get(ATTEMPTS_TAG, "1")) + 1),
                LOST_TAG: str(int(previous.get(LOST_TAG, "0")) + lost),
                ATTEMPT_IDS_TAG: ",".join(ids),
            }
            if self.job_id and JOB_TAG not in previous:
                tags[JOB_TAG] = self.job_id
            self.mlflow.set_tags(tags)
            self.mlflow.log_metric("progress_lost_steps", lost, step=resumed_step)
            log.info("resumed MLflow run %s at step %d (lost %d steps)", run_id, resumed_step, lost)
        self.run_id = active.info.run_id
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        existing = self.client.get_run(self.run_id).data.params if self.run_id else {}
        fresh = {k: str(v)[:6000] for k, v in params.items() if k not in existing}
        if fresh:
            self.mlflow.log_params(fresh)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.mlflow.set_tags(dict(tags))

    def log_model(self, model: torch.nn.Module, example: torch.Tensor) -> None:
        """Log (and register) the model as served (the MLP: raw features in, probability of delay out;
        the transformer: tokens in, next-token logits out), its signature from `example`'s output."""
        import mlflow.pytorch
        from mlflow.models import infer_signature

        with torch.no_grad():
            output = model(example).numpy()
        signature = infer_signature(example.numpy(), output)
        mlflow.pytorch.log_model(
            model,
            name="model",
            signature=signature,
            input_example=example.numpy(),
            registered_model_name=self.cfg.register_model,
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )

    def end(self, status: str) -> None:
        self.mlflow.end_run(status=status)


def make_tracker(
    cfg: MlflowConfig, workdir: str, rank: int, job_id: str | None, attempt_id: str | None
) -> Tracker:
    if rank != 0 or not cfg.enabled:
        return Tracker()
    return MlflowTracker(cfg, workdir, job_id, attempt_id)
