"""GpuTrainingOperator: one training job on gpuyard's GPUs per task instance, followed to its end.

`execute` builds a JobSpec (`python -m training.run --config <training_config> --set k=v ...`)
from the operator's arguments and the run's Params, submits it with an Idempotency-Key derived
from the task instance, stores the job in the task state store and defers to GpuJobTrigger, which
narrates the job in the task log; `deferrable=False` follows it in the worker instead.

Which job a try follows (ResumableJobMixin's re-attach, with the key closing its gap):
- the key is `airflow/<dag>/<run>/<task>/<map index>`, so a retry of the task (the worker was
  killed, the triggerer restarted, a timeout failed the try) finds the same job: from the task
  state store, or, when the worker died between the submit and storing the id, from the key
  itself, which the API answers with the job it made before;
- a job that ended FAILED or CANCELLED (or is being cancelled) is replaced on the next try by a
  fresh one (`.../gen-N`), as an Airflow retry means; one that SUCCEEDED is not run again;
- with the `new_job` param, a cleared task starts a fresh job (`.../clear-N`, the run's clear
  count), instead of re-attaching to the one its earlier run made;
- marking the task failed, clearing or killing it cancels the job (the trigger's or the
  operator's `on_kill`).

The job id (`gpuyard_job_id`, which the job link reads), the MLflow run id (`mlflow_run_id`) and
the model URI (`model_uri`) go to XCom; the return value holds them with the job's attempts and
the progress lost. The connection's token never leaves the hook: not in the spec, templates,
trigger arguments or XCom.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, ResumableJobMixin
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout
from gpuyard_client import TERMINAL_STATES, ApiError, GpuyardClient

from gpuyard_provider.hooks.gpuyard import GpuyardHook
from gpuyard_provider.links import JOB_ID_XCOM, GpuyardJobLink
from gpuyard_provider.narration import TERMINAL_JOB_EVENTS, Story, lost_steps, tell_batch
from gpuyard_provider.triggers.job import CURSOR_XCOM, TIMED_OUT, GpuJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

# The job's size and standing: templated arguments ("{{ params.gpus }}"), rendered as strings unless
# the DAG renders native objects, and read back here with their types (a bad one names its argument).
CHOICES: dict[str, tuple[type, Any]] = {  # argument: (type, default)
    "gpus": (int, 1),
    "gpu_type": (str, None),
    "priority": (str, "normal"),
    "preemptible": (bool, False),
    "max_steps": (int, None),
    "new_job": (bool, False),
}
NONE_TEXT = frozenset({"", "None", "null"})  # how Jinja renders a None Param
BOOL_TEXT = {"true": True, "false": False}
BACKSTOP_S = 60  # Airflow's deferral timeout, past the trigger's deadline (the trigger module)
ACTIVE = frozenset({"PENDING", "SCHEDULED", "RUNNING"})
CANCELLING = "CANCELLING"  # a job asked to cancel that has not ended yet: not worth re-attaching to
SUPERSEDED = "SUPERSEDED"  # the stored job belongs to an earlier clear of a `new_job` task
MAX_KEY = 255


def idempotency_key(
    dag_id: str, run_id: str, task_id: str, map_index: int, *, clear: int = 0, generation: int = 0
) -> str:
    """The task instance's Idempotency-Key: the same on every retry of the same job."""
    key = f"airflow/{dag_id}/{run_id}/{task_id}/{map_index}"
    key += f"/clear-{clear}" if clear else ""
    key += f"/gen-{generation}" if generation else ""
    return key if len(key) <= MAX_KEY else "airflow/sha256-" + hashlib.sha256(key.encode()).hexdigest()


def choice(argument: str, value: Any) -> Any:
    """A rendered job argument with its type (CHOICES), its default for None."""
    kind, default = CHOICES[argument]
    if value is None or (isinstance(value, str) and value.strip() in NONE_TEXT):
        return default
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_TEXT:
            return BOOL_TEXT[value.strip().lower()]
    elif kind is int:
        if not isinstance(value, bool) and isinstance(value, int | str) and str(value).strip().isdigit():
            return int(value)
    elif isinstance(value, str):
        return value
    raise ValueError(f"GpuTrainingOperator argument {argument}: expected {kind.__name__}, got {value!r}")


def key_digest(key: str) -> str:
    """A short name for the job's own folders (checkpoints, work directory)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class GpuTrainingOperator(ResumableJobMixin, BaseOperator):
    """Run `python -m training.run` as a gpuyard job. See the module docstring and docs/airflow.md.

    :param name: job name (a DNS label).
    :param team: the team the job is charged to; the connection's token must belong to it.
    :param training_config: the training config (or pipeline definition) on the worker, relative
        to its working directory.
    :param checkpoint_root: fsspec URL; the job checkpoints under `<root>/<key digest>`.
    :param overrides: `--set KEY=VALUE` pairs for the training config (a mapping over this gives
        one job per map index: `.partial(...).expand(overrides=[...])`).
    :param gpus, gpu_type, priority, preemptible, max_steps, new_job: the job's size and standing,
        templated (a DAG hands its Params on as "{{ params.gpus }}"); None takes the default
        (1 GPU of any type, normal priority, not preemptible, the config's steps, no fresh job).
    :param workdir_root: when set, the job's work directory is `<root>/<key digest>`.
    :param mlflow_tracking_uri: where the training run logs; also where the operator finds the
        run and the registered model of the job. `mlflow_parent_run_id` makes the run its child.
    :param env_from_secret: variable -> name of a secret of the team, set in the workers'
        environment by reference (e.g. the team's MLflow credentials); never a value here.
    :param deferrable: follow the job in the triggerer (frees the worker slot); None takes
        `[operators] default_deferrable` (false unless set).
    :param execution_timeout: also caps the job: at the try's start plus this, the job is
        cancelled and the try fails (in the trigger when deferred, else in the worker).
    """

    template_fields: Sequence[str] = (
        "name",
        "team",
        "training_config",
        "checkpoint_root",
        "overrides",
        "env",
        "labels",
        "reproducibility",
        "workdir_root",
        "mlflow_tracking_uri",
        "mlflow_parent_run_id",
        "image",
        "nodes",
        "max_failures",
        "env_from_secret",
        *CHOICES,
    )
    template_fields_renderers = {"overrides": "json", "env": "json", "reproducibility": "json"}
    operator_extra_links = (GpuyardJobLink(),)
    external_id_key = "gpuyard_job"
    ui_color = "#c9e4de"

    def __init__(
        self,
        *,
        name: str,
        team: str,
        training_config: str,
        checkpoint_root: str,
        overrides: Mapping[str, Any] | None = None,
        image: str = "python:3.11-slim",
        gpus: int | str | None = None,
        gpu_type: str | None = None,
        nodes: int | str = 1,
        priority: str | None = None,
        preemptible: bool | str | None = None,
        max_steps: int | str | None = None,
        new_job: bool | str | None = None,
        max_failures: int | str = 2,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        reproducibility: Mapping[str, Any] | None = None,
        workdir_root: str | None = None,
        mlflow_tracking_uri: str | None = None,
        mlflow_parent_run_id: str | None = None,
        env_from_secret: Mapping[str, str] | None = None,
        gpuyard_conn_id: str = GpuyardHook.default_conn_name,
        deferrable: bool | None = None,
        poll_s: float = 20.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.name, self.team, self.training_config = name, team, training_config
        self.checkpoint_root, self.image, self.nodes = checkpoint_root, image, nodes
        self.overrides = dict(overrides or {})
        self.gpus, self.gpu_type, self.priority = gpus, gpu_type, priority
        self.preemptible, self.max_steps, self.new_job = preemptible, max_steps, new_job
        self.max_failures = max_failures
        self.env, self.labels = dict(env or {}), dict(labels or {})
        self.env_from_secret = dict(env_from_secret or {})
        self.reproducibility = dict(reproducibility or {})
        self.workdir_root = workdir_root
        self.mlflow_tracking_uri, self.mlflow_parent_run_id = mlflow_tracking_uri, mlflow_parent_run_id
        if deferrable is None:
            from airflow.sdk.configuration import conf

            deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)
        self.gpuyard_conn_id, self.deferrable, self.poll_s = gpuyard_conn_id, deferrable, poll_s
        self._job_id: str | None = None
        self._result: dict[str, Any] | None = None  # the job's outcome, once it ended

    # -- what to run -------------------------------------------------------------------------------

    def chosen(self) -> dict[str, Any]:
        """The job's size and standing as rendered, with their types and defaults."""
        return {argument: choice(argument, getattr(self, argument)) for argument in CHOICES}

    def key(self, context: Context, generation: int = 0) -> str:
        ti = context["ti"]
        clear = (context["dag_run"].clear_number or 0) if self.chosen()["new_job"] else 0
        return idempotency_key(
            ti.dag_id, ti.run_id, ti.task_id, ti.map_index, clear=clear, generation=generation
        )

    def job_spec(self, context: Context, key: str) -> dict[str, Any]:
        """The JobSpec of this task instance's job: the same for the same key on every try."""
        ti, chosen, digest = context["ti"], self.chosen(), key_digest(key)
        sets = dict(self.overrides)
        if chosen["max_steps"] is not None:
            sets["train.max_steps"] = int(chosen["max_steps"])
        if self.workdir_root:
            sets["workdir"] = f"{self.workdir_root.rstrip('/')}/{digest}"
        command = ["python", "-m", "training.run", "--config", self.training_config]
        for setting, value in sets.items():
            # JSON is YAML: training/config.py reads every value back with its type (a string stays one)
            command += ["--set", f"{setting}={json.dumps(value)}"]
        env = dict(self.env)
        if self.mlflow_tracking_uri:
            env["MLFLOW_TRACKING_URI"] = self.mlflow_tracking_uri
        if self.mlflow_parent_run_id:
            env["MLFLOW_PARENT_RUN_ID"] = self.mlflow_parent_run_id
        labels = {
            "airflow.dag_id": ti.dag_id,
            "airflow.run_id": ti.run_id,
            "airflow.task_id": ti.task_id,
            "airflow.map_index": str(ti.map_index),
            **self.labels,
        }
        return {
            "name": self.name,
            "team": self.team,
            "image": self.image,
            "command": command,
            "env": env,
            "env_from_secret": dict(self.env_from_secret),
            "resources": {
                "gpus": int(chosen["gpus"]),
                "gpu_types": [chosen["gpu_type"]] if chosen["gpu_type"] else [],
                "nodes": int(self.nodes),
            },
            "priority": chosen["priority"],
            "preemptible": bool(chosen["preemptible"]),
            "retry": {"max_failures": int(self.max_failures)},
            "checkpoint": {"url": f"{self.checkpoint_root.rstrip('/')}/{digest}", "interval": "auto"},
            "reproducibility": self.reproducibility,
            "labels": labels,
        }

    # -- ResumableJobMixin -------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        return self.execute_resumable(context)

    def submit_job(self, context: Context) -> dict[str, Any]:
        stored = (
            context["task_state_store"].get(self.external_id_key) if "task_state_store" in context else None
        )
        generation = 0
        if isinstance(stored, dict) and stored.get("key") == self.key(context, stored.get("generation", 0)):
            generation = int(stored.get("generation", 0)) + 1  # the stored job ended without success
        key = self.key(context, generation)
        spec = self.job_spec(context, key)
        with GpuyardHook(self.gpuyard_conn_id).get_conn() as client:
            try:
                job = client.submit(spec, idempotency_key=key)
            except ApiError as error:
                hint = (
                    " The definition or the run's Params changed since this key made its job: clear the"
                    " task with the `new_job` param to start a fresh job."
                    if error.status == 409
                    else ""
                )
                raise AirflowException(f"gpuyard refused the job: {error}{hint}") from None
        self._job_id = job["id"]
        resources = spec["resources"]
        self.log.info(
            f"gpuyard job {job['id']} ({job['state']}, {job['attempt_count']} attempt(s) so far) for "
            f"Idempotency-Key {key}: {resources['gpus']} GPU(s) of {resources['gpu_types'] or 'any type'}, "
            f"priority {spec['priority']}, {'preemptible' if spec['preemptible'] else 'not preemptible'}"
        )
        context["ti"].xcom_push(key=JOB_ID_XCOM, value=job["id"])
        return {"job_id": job["id"], "key": key, "generation": generation}

    def get_job_status(self, external_id: Any, context: Context) -> str:
        if not isinstance(external_id, dict) or external_id.get("key") != self.key(
            context, int(external_id.get("generation", 0))
        ):
            return SUPERSEDED
        with GpuyardHook(self.gpuyard_conn_id).get_conn() as client:
            job = client.job(external_id["job_id"])
        if job["cancel_requested"] and job["state"] not in TERMINAL_STATES:
            return CANCELLING
        self._job_id = job["id"]
        context["ti"].xcom_push(key=JOB_ID_XCOM, value=job["id"])
        return str(job["state"])

    def is_job_active(self, status: str) -> bool:
        return status in ACTIVE

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Context) -> None:
        job_id = external_id["job_id"]
        if self.deferrable:
            ti = context["ti"]
            # The trigger resumes from this XCom after a triggerer restart: written now, this try
            # starts from 0 whatever an earlier try saved, and a first start finds it (Airflow logs a
            # missing XCom as an error).
            ti.xcom_push(key=CURSOR_XCOM, value=0)
            # The try's start anchors the deadline (as the Kubernetes pod operator's does): a
            # resumption or a re-deferral keeps it
            deadline = (
                ti.start_date.timestamp() + self.execution_timeout.total_seconds()
                if self.execution_timeout is not None and ti.start_date is not None
                else None
            )
            self.defer(
                trigger=GpuJobTrigger(
                    job_id=job_id,
                    cursor=0,  # each try's log tells the job's whole story
                    dag_id=ti.dag_id,
                    run_id=ti.run_id,
                    task_id=ti.task_id,
                    map_index=ti.map_index,
                    gpuyard_conn_id=self.gpuyard_conn_id,
                    deadline=deadline,
                ),
                method_name="execute_complete",
                # Airflow's own timeout fails the task without a word to the job: a backstop only
                timeout=None if deadline is None else max(deadline - time.time(), 0) + BACKSTOP_S,
            )
        with GpuyardHook(self.gpuyard_conn_id).get_conn() as client:
            job = self._follow(client, job_id)
        self._raise_unless_succeeded(job)

    def get_job_result(self, external_id: Any, context: Context) -> dict[str, Any]:
        with GpuyardHook(self.gpuyard_conn_id).get_conn() as client:
            job = client.job(external_id["job_id"])
        result = self.result_of(job)
        for key in ("mlflow_run_id", "model_uri"):
            context["ti"].xcom_push(key=key, value=result[key])
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The run's OpenLineage lineage (asked only where a deployment configured OpenLineage): the
        training data it read (`data.path`), the model its MLflow run logged, and the job as the
        `gpuyard_job` run facet."""
        from gpuyard_provider import openlineage as ol

        result = self._result
        if result is None:
            return None
        data = self.overrides.get("data.path")
        model = result.get("model_uri")
        return ol.operator_lineage(
            inputs=[ol.read(*ol.storage_name(str(data)))] if data else [],
            outputs=[ol.wrote(*ol.mlflow_name(self.mlflow_tracking_uri, model))]
            if model and self.mlflow_tracking_uri
            else [],
            job=ol.job_facet(result),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resumed by GpuJobTrigger once the job ended, or its deadline passed."""
        if event["state"] == TIMED_OUT:
            self._job_id = event["job_id"]
            self.on_kill()
            raise AirflowTaskTimeout(
                f"gpuyard job {event['job_id']}: execution_timeout ({self.execution_timeout}) passed;"
                " the job was cancelled"
            )
        if event["state"] != "SUCCEEDED":
            raise AirflowException(
                f"gpuyard job {event['job_id']} {event['state']}: {event.get('reason') or ''}"
            )
        return self.get_job_result({"job_id": event["job_id"]}, context)

    def on_kill(self) -> None:
        if self._job_id is None:
            return
        with GpuyardHook(self.gpuyard_conn_id).get_conn() as client:
            try:
                client.cancel(self._job_id)
                self.log.info(f"gpuyard job {self._job_id}: cancelled (the task was killed)")
            except ApiError as error:
                if error.status != 409:
                    raise

    # -- following in the worker (deferrable=False) -------------------------------------------------

    def _follow(self, client: GpuyardClient, job_id: str) -> dict[str, Any]:
        """Tell the job's events from its first until it ends (long polls of `poll_s`)."""
        cursor, story = 0, Story()
        while True:
            page = client.events(job_id=job_id, after=cursor, wait_s=self.poll_s)
            events = page["events"]
            needed = any(story.needs_attempt(event) for event in events)
            lines = tell_batch(story, events, client.job(job_id) if needed else None)
            if lines:
                self.log.info("\n".join(lines))
            cursor = page["cursor"]
            if any(event["type"] in TERMINAL_JOB_EVENTS for event in events):
                break
        job = client.job(job_id)
        self.log.info(f"gpuyard {story.summary(job_id, job['state'], job.get('reason'))}")
        return job

    def _raise_unless_succeeded(self, job: Mapping[str, Any]) -> None:
        if job["state"] != "SUCCEEDED":
            raise AirflowException(f"gpuyard job {job['id']} {job['state']}: {job.get('reason') or ''}")

    # -- what the task hands on -----------------------------------------------------------------------

    def result_of(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """The job's outcome as XCom: ids, attempts, interruptions and, with MLflow, run and model."""
        attempts = job.get("attempts") or []
        interrupted = [a for a in attempts if a["state"] in ("PREEMPTED", "LOST")]
        run_id, model_uri = (
            self._mlflow_run_and_model(job["id"]) if self.mlflow_tracking_uri else (None, None)
        )
        self._result = {  # kept for OpenLineage's listener, which asks this process once the task ended
            "job_id": job["id"],
            "state": job["state"],
            "attempts": len(attempts),
            "preemptions": sum(a["state"] == "PREEMPTED" for a in attempts),
            "lost_steps": sum(lost_steps(a) or 0 for a in interrupted),
            "resumed_from_steps": [a["checkpoint_step"] for a in interrupted],
            "mlflow_run_id": run_id,
            "model_uri": model_uri,
        }
        return self._result

    def _mlflow_run_and_model(self, job_id: str) -> tuple[str | None, str | None]:
        """The job's MLflow run (tagged with its job id by the training runtime) and the model it
        logged: the registered version when there is one, else the logged model itself."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.mlflow_tracking_uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(
            experiments, filter_string=f"tags.`gpuyard.job_id` = '{job_id}'", max_results=1
        )
        if not runs:
            return None, None
        run = runs[0]
        versions = client.search_model_versions(f"run_id = '{run.info.run_id}'")
        if versions:
            newest = max(versions, key=lambda v: int(v.version))
            return run.info.run_id, f"models:/{newest.name}/{newest.version}"
        logged = client.search_logged_models(
            [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'", max_results=1
        )
        return run.info.run_id, (f"models:/{logged[0].model_id}" if logged else None)
