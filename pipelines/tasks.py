"""A model pipeline's steps as Airflow tasks, shared by every pipeline's DAG file (dags/<name>.py).

Each function adds one step to the DAG being defined and returns it (a task's output, or its
operators) for the DAG file to wire: `run = step.start(PIPELINE)`, `step.ingest(PIPELINE, run)`.
Tasks carry the definition's path and read the file again when they run; the days a run covers come
from `start` (its XCom), so every step of a run sees the same window. Heavy imports (Spark, Feast,
Great Expectations, MLflow) happen inside the tasks, never when a DAG file is parsed.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import (
    Asset,
    Param,
    PartitionedAssetTimetable,
    TaskGroup,
    TriggerRule,
    get_current_context,
    task,
)
from airflow.sdk.exceptions import AirflowSkipException
from gpuyard_provider.operators.training import GpuTrainingOperator

from pipelines import mlflow_access, storage
from pipelines import openlineage_events as events
from pipelines import prepare as prepare_step
from pipelines.definition import (
    CHECKPOINT_ROOT_VARIABLE,
    REPOSITORY,
    TRAINING_IMAGE_VARIABLE,
    PipelineDefinition,
    load_definition,
)

if TYPE_CHECKING:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

log = logging.getLogger(__name__)
START = "{{{{ ti.xcom_pull(task_ids='start')['{field}'] }}}}"  # a field of the run's window


def deployment(variable: str, default: str) -> str:
    """A template of the Airflow Variable `variable`, `default` where it is unset."""
    return f"{{{{ var.value.get({variable!r}, {default!r}) }}}}"


def raw_asset(definition: PipelineDefinition) -> Asset:
    """The landing zone of the source's announced raw table (for flights, raw flights): an event on it with
    partition key D (the raw day D landed) triggers a retraining run for D; with
    ``extra={"correction": true}`` it says the raw day D was landed again with corrections
    (pipelines/corrections.py)."""
    table = definition.source.announced
    return Asset(
        name=f"{definition.name}/raw/{table}",
        uri=storage.join(definition.data.root, "raw", table),
        group="raw",
    )


def model_asset(definition: PipelineDefinition, environment: str | None = None) -> Asset:
    """The model in an environment (default: the first, publication's): an event on it each time
    the environment's alias moves."""
    model = definition.promotion.model
    alias = definition.promotion.environment(environment).alias if environment else definition.promotion.alias
    return Asset(name=f"{model}@{alias}", uri=f"mlflow-models://{model}/{alias}", group="model")


def schedule(definition: PipelineDefinition) -> PartitionedAssetTimetable:
    """One run per raw partition announced on the raw asset: by its producer, or by the
    pipeline's landing check on the definition's schedule (pipelines/landings.py). A partition key
    is a day (identity mapping): the run for key D trains through D."""
    return PartitionedAssetTimetable(assets=raw_asset(definition))


def retraining_dag(definition: PipelineDefinition) -> dict[str, Any]:
    """The retraining DAG's arguments but its steps: its id, schedule, Params, retries and failure
    report, written once for dags/<name>.py and the tests' copies of it."""
    return {
        "dag_id": definition.name,
        "description": definition.description,
        "schedule": schedule(definition),
        "start_date": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "catchup": False,
        "max_active_runs": 1,
        "params": params(definition),
        "default_args": {"owner": definition.owner, "retries": 1, "retry_delay": dt.timedelta(seconds=30)},
        "tags": ["gpuyard", "retraining"],
        "on_failure_callback": report_failure,  # names the failed tasks
    }


def params(definition: PipelineDefinition) -> dict[str, Param]:
    """The Params form of a manual run; its defaults are the definition's."""
    job = definition.job
    return {
        "run_date": Param(
            definition.data.run_date.isoformat(),
            type="string",
            format="date",
            title="Run date",
            description="the newest day of data a manual run takes (a partition's run takes its day)",
        ),
        "max_steps": Param(job.max_steps, type="integer", minimum=1, title="Training steps"),
        "gpus": Param(job.gpus, type="integer", minimum=1, title="GPUs per job"),
        "gpu_type": Param(job.gpu_type, type=["null", "string"], title="GPU type"),
        "priority": Param(job.priority, enum=["low", "normal", "high"], title="Priority"),
        "preemptible": Param(job.preemptible, type="boolean", title="Preemptible"),
        "new_job": Param(
            False,
            type="boolean",
            title="Fresh training job",
            description="clearing the train task starts a new job instead of re-attaching to this run's",
        ),
    }


def _definition(path: str) -> PipelineDefinition:
    return load_definition(path)


def _corrected_days(context: Any) -> list[dt.date]:
    """The raw days that the asset events which triggered this run say were re-landed with corrections."""
    from pipelines import corrections

    events = [e for batch in (context.get("triggering_asset_events") or {}).values() for e in batch]
    return corrections.corrected_days((e.partition_key, e.extra) for e in events)


@task(task_id="start")
def _start(path: str) -> dict[str, Any]:
    from pipelines import lineage

    context = get_current_context()
    definition = _definition(path)
    corrected = _corrected_days(context)
    # a run for a partition (landed, announced, or a correction of that day) trains through that day;
    # a manual run without one takes its Params
    run_date = context.get("partition_key") or context["params"]["run_date"]
    window = definition.window(run_date)
    days: dict[str, Any] = {k: str(v) for k, v in window.model_dump().items()}
    days |= {"holdout_end": str(window.holdout_end), "corrected_dates": [str(d) for d in corrected]}
    dag_run = context["dag_run"]
    logical = context.get("logical_date")
    return lineage.start_run(
        definition,
        dag_id=dag_run.dag_id,
        run_id=dag_run.run_id,
        logical_date=logical.isoformat() if logical else None,
        params=dict(context["params"]),
        window=days,
    )


def start(definition: PipelineDefinition) -> Any:
    """The run's window (through its partition key's day, else its Params' run date) and its MLflow run.

    The run's setup (`finish` is its teardown): Airflow runs it again with any task cleared, and it
    then returns what the DAG run's first start chose (pipelines/lineage.py). Its direct downstream
    tasks keep the default trigger rule (Airflow's rule for setups); a task after a branch reads
    the window from XCom instead (`_run_window`).
    """
    return _start(str(definition.path))


def _config(path: str, run: dict[str, Any]) -> Any:
    definition = _definition(path)
    return definition.step_config(definition.window(run["run_date"]))


@task(task_id="ingest")
def _ingest(path: str, run: dict[str, Any]) -> dict[str, int]:
    from pipelines import ingest

    config = _config(path, run)
    corrected = [dt.date.fromisoformat(d) for d in run.get("corrected_dates", [])]
    landed = ingest.ingest(config, dt.date.fromisoformat(run["raw_start"]), config.end_date, keep=corrected)
    _lineage(events.ingest, _definition(path), [str(d) for d in landed.dates])
    return dict(landed.rows)


def ingest(definition: PipelineDefinition, run: Any) -> Any:
    """Land the raw tables of the run's days (and the look-back the windows need); a day a
    correction event named stays as its producer re-landed it."""
    return _ingest(str(definition.path), run)


@task(task_id="reprepare_corrections")
def _reprepare_corrections(path: str, run: dict[str, Any]) -> list[list[str]]:
    from pipelines import corrections

    config = _config(path, run)
    corrected = [dt.date.fromisoformat(d) for d in run.get("corrected_dates", [])]
    own = (dt.date.fromisoformat(run["prepare_start"]), dt.date.fromisoformat(run["run_date"]))
    runs = corrections.reprepare_days(config, corrected, skip=own)
    return [[str(first), str(last)] for first, last in runs]


def reprepare_corrections(definition: PipelineDefinition, run: Any) -> Any:
    """Re-prepare only what corrected raw days (correction events on the raw asset) reach: their
    dates and the trailing windows after them, outside the days this run prepares anyway."""
    return _reprepare_corrections(str(definition.path), run)


@task(task_id="validate_raw")
def _validate_raw(path: str, run: dict[str, Any]) -> list[str]:
    from pipelines import validate

    config = _config(path, run)
    reports = validate.validate_raw(config, dt.date.fromisoformat(run["raw_start"]), config.end_date)
    return [r.report_url for r in reports]


def validate_raw(definition: PipelineDefinition, run: Any) -> Any:
    return _validate_raw(str(definition.path), run)


def spark_connection(definition: PipelineDefinition) -> str:
    """The Airflow connection spark-submit uses: the master the definition names (_spark_master)."""
    return f"spark_{definition.name}"


def _spark_master(definition: PipelineDefinition) -> Callable[[Any], None]:
    """The Spark jobs' pre_execute: defines their connection in the task's own process as it runs
    (not as the DAG file is parsed), unless the deployment defined it already (a cluster's
    credentials)."""
    variable = f"AIRFLOW_CONN_{spark_connection(definition).upper()}"
    connection = json.dumps({"conn_type": "spark", "host": definition.spark.master})

    def define(context: Any) -> None:
        os.environ.setdefault(variable, connection)

    return define


def _spark_jobs(definition: PipelineDefinition) -> list[SparkSubmitOperator]:
    # imported here: Spark's hook loads the Kubernetes clients (about a second), which every task
    # process of a DAG without Spark jobs (every parse of its file) would pay for nothing
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    config = definition.step_config()  # the days come from the run: templates below
    start, end = START.format(field="prepare_start"), START.format(field="run_date")
    jobs = [
        SparkSubmitOperator(
            task_id=job,
            application=str(definition.source.job_script(job)),
            application_args=prepare_step.job_arguments(config, job, start, end),
            conn_id=spark_connection(definition),
            pre_execute=_spark_master(definition),
            conf={"spark.sql.session.timeZone": "UTC"},
            name=f"{definition.name}-{job}",
            env_vars={"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
        )
        for job in definition.spark.jobs or ()
    ]
    for job in jobs:  # their lineage, from the run's window, if OpenLineage's listener asks
        job.get_openlineage_facets_on_complete = functools.partial(
            events.spark_job, str(definition.path), job.task_id
        )
    return jobs


def _lineage(build: Callable[..., Any], *args: Any) -> None:
    """This task's OpenLineage lineage, `build(*args)`, built only if a configured listener asks."""
    events.attach(get_current_context()["task"], build, *args)


def _run_window() -> dict[str, Any]:
    return get_current_context()["ti"].xcom_pull(task_ids="start")


@task(task_id="prepare_pandas")
def _prepare_pandas(path: str) -> dict[str, str]:
    run = _run_window()
    config = _config(path, run)
    tables = prepare_step.prepare(config, config.start_date, config.end_date, engine="pandas")
    read = prepare_step.read_days(config, config.start_date, config.end_date)
    _lineage(events.prepare, _definition(path), events.days(*read))
    return tables


@task.branch(task_id="choose_engine")
def _choose_engine(path: str, spark_tasks: list[str]) -> list[str]:
    config = _config(path, _run_window())
    engine, _ = prepare_step.resolve_engine(config, config.start_date, config.end_date)
    return spark_tasks if engine == "spark" else ["prepare_pandas"]


def prepare(definition: PipelineDefinition) -> TaskGroup:
    """The preparation: one SparkSubmitOperator per Spark job, or the pandas engine in one task.
    With `engine: auto` a branch picks by the rows the run reads (pipelines/prepare.py)."""
    engine = definition.spark.engine
    with TaskGroup("prepare", prefix_group_id=False) as group:
        spark = _spark_jobs(definition) if engine in ("auto", "spark") else []
        pandas = _prepare_pandas(str(definition.path)) if engine in ("auto", "pandas") else None
        if engine == "auto":
            _choose_engine(str(definition.path), [t.task_id for t in spark]) >> [*spark, pandas]
    return group


# after the preparation's branch: the engine not taken is skipped; the window from XCom, since a
# setup's direct downstream tasks must keep the default trigger rule
@task(task_id="validate_features", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
def _validate_features(path: str) -> list[str]:
    from pipelines import validate

    return [r.report_url for r in validate.validate_features(_config(path, _run_window()))]


def validate_features(definition: PipelineDefinition) -> Any:
    return _validate_features(str(definition.path))


@task(task_id="feast_apply")
def _feast_apply(path: str, run: dict[str, Any]) -> list[str]:
    from pipelines import features

    return features.apply(_config(path, run))


def feast_apply(definition: PipelineDefinition, run: Any) -> Any:
    return _feast_apply(str(definition.path), run)


@task(task_id="materialize")
def _materialize(path: str, run: dict[str, Any]) -> list[str]:
    from pipelines import features

    config = _config(path, run)
    return features.materialize(config, features.serving_instant(config))


def materialize(definition: PipelineDefinition, run: Any) -> Any:
    """Load the features up to the run date into the online store (serving)."""
    return _materialize(str(definition.path), run)


@task(task_id="training_set")
def _training_set(path: str, run: dict[str, Any]) -> dict[str, Any]:
    from pipelines import lineage, training_set

    config = _config(path, run)
    day = dt.date.fromisoformat
    parts = {
        "train": (day(run["train_start"]), day(run["train_end"])),
        "holdout": (day(run["holdout_start"]), day(run["holdout_end"])),
    }
    built = {}
    for part, result in training_set.build_training_sets(config, parts).items():
        built[part] = {
            "manifest_url": result.manifest_url,
            "data_url": result.data_url,
            "rows": result.manifest["row_count"],
            "positive_rate": result.manifest["positive_rate"],
            "data_snapshot_id": result.manifest["data_snapshot_id"],
            "manifest_sha256": lineage.manifest_digest(result.manifest_url),
            "feature_service": {
                k: result.manifest["feature_service"][k] for k in ("name", "version", "fingerprint")
            },
        }
    _lineage(events.training_set, _definition(path), built)
    return built


def training_set(definition: PipelineDefinition, run: Any) -> Any:
    """Point-in-time training set of the training days, and the held-out set of the newest days."""
    return _training_set(str(definition.path), run)


@task(task_id="validate_training_set")
def _validate_training_set(sets: dict[str, Any]) -> list[str]:
    from pipelines import validate

    return [
        validate.validate_training_set(sets[part]["manifest_url"]).report_url for part in ("train", "holdout")
    ]


def validate_training_set(definition: PipelineDefinition, sets: Any) -> Any:
    return _validate_training_set(sets)


def _work_root(definition: PipelineDefinition) -> str:
    """Where the training jobs keep their work directories (events, a store of their own)."""
    return storage.join(definition.data.root, "train")


@task(task_id="grid")
def _grid(path: str, sets: dict[str, Any]) -> list[dict[str, Any]]:
    """The jobs' overrides; first the roots they write under, open to their teams' users, and the
    team's rights on the tracking server (EDIT on the experiment, READ on the registered model)."""
    from pipelines import lineage

    definition = _definition(path)
    storage.shared_root(definition.checkpoint_root)
    storage.shared_root(_work_root(definition))
    pipeline = mlflow_access.from_environment()
    if pipeline is not None:
        experiment = lineage.experiment_id(definition)
        model = definition.promotion.model
        mlflow_access.grant_team(definition.tracking_uri, definition.job.team, experiment, model, pipeline)
    # the jobs log their models in their runs; the pipeline registers them (pick_best)
    fixed = {"data.path": sets["train"]["data_url"], "mlflow.experiment": definition.experiment}
    if definition.artifact_location is not None:
        fixed["mlflow.artifact_location"] = definition.artifact_location
    return [fixed | dict(entry) for entry in definition.job.grid]


def train(definition: PipelineDefinition, sets: Any) -> Any:
    """One GPU training job per entry of the definition's grid (dynamic task mapping)."""
    job = definition.job
    relative = definition.path.relative_to(REPOSITORY) if definition.path.is_relative_to(REPOSITORY) else None
    return GpuTrainingOperator.partial(
        task_id="train",
        name=f"{definition.name.replace('_', '-')}-train",
        team=job.team,
        training_config=str(relative or definition.path),
        checkpoint_root=deployment(CHECKPOINT_ROOT_VARIABLE, definition.checkpoint_root),
        image=deployment(TRAINING_IMAGE_VARIABLE, job.image),
        nodes=job.nodes,
        max_failures=job.max_failures,
        workdir_root=storage.local_path(_work_root(definition))
        if storage.is_local(definition.data.root)
        else None,
        mlflow_tracking_uri=definition.tracking_uri,
        mlflow_parent_run_id=START.format(field="mlflow_run_id"),
        # the team's MLflow user, by reference to its secrets, where the tracking server asks for one
        env_from_secret=mlflow_access.SECRET_ENV if mlflow_access.from_environment() else None,
        reproducibility={
            "seed": int(definition.training.get("seed", 0)),
            "code_version": START.format(field="git_commit"),
            "data_snapshot": "{{ ti.xcom_pull(task_ids='training_set')['train']['data_snapshot_id'] }}",
        },
        labels={"pipeline": definition.name},
        # the run's Params (the form's values, else the definition's), each to its argument
        max_steps="{{ params.max_steps }}",
        gpus="{{ params.gpus }}",
        gpu_type="{{ params.gpu_type }}",
        priority="{{ params.priority }}",
        preemptible="{{ params.preemptible }}",
        new_job="{{ params.new_job }}",
    ).expand(overrides=_grid(str(definition.path), sets))


@task(task_id="pick_best")
def _pick_best(path: str, sets: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    from pipelines import lineage

    definition = _definition(path)
    mlflow = lineage.client(definition)
    scored, registered = [], []
    for result in results:
        lineage.tag_training_run(definition, result["mlflow_run_id"], result, sets["train"])
        run = mlflow.get_run(result["mlflow_run_id"])
        if result["model_uri"]:  # the model the job logged, registered by the pipeline's identity
            version = lineage.register(definition, result["mlflow_run_id"], result["model_uri"])
            registered.append(version)
            result = {**result, "model_uri": version}
        scored.append((run.data.metrics.get("val_loss", float("inf")), result))
    best_loss, best = min(scored, key=lambda pair: pair[0])
    for loss, result in scored:
        if result is not best and result["model_uri"]:
            version = str(result["model_uri"]).rsplit("/", 1)[-1]
            reason = f"not the best of the grid: val_loss {loss:.4f} > {best_loss:.4f}"
            lineage.tag_version(definition, version, {"rejected": reason})
    _lineage(events.pick_best, definition, results, registered)
    return {**best, "val_loss": best_loss, "grid_size": len(scored)}


def pick_best(definition: PipelineDefinition, sets: Any, candidates: Any) -> Any:
    """Register each candidate's model (the pipeline's identity: jobs never write the registry); the
    one of the grid with the lowest val_loss goes on, the others are tagged rejected."""
    return _pick_best(str(definition.path), sets, candidates.output)


@task(task_id="evaluate")
def _evaluate(path: str, run: dict[str, Any], best: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    from pipelines import evaluate as evaluation
    from pipelines import lineage

    definition = _definition(path)
    verdict = evaluation.evaluate(definition, best, sets["holdout"]["manifest_url"])
    metric = verdict.metric
    scores = {f"candidate_{metric}": verdict.candidate.value}
    if verdict.champion is not None:
        scores[f"champion_{metric}"] = verdict.champion.value
    lineage.log_to_run(run["mlflow_run_id"], definition, scores, **{"evaluation.reason": verdict.reason})
    lineage.log_to_run(best["mlflow_run_id"], definition, {f"holdout_{metric}": verdict.candidate.value})
    outcome = {**verdict.as_dict(), "job_id": best["job_id"], "mlflow_run_id": best["mlflow_run_id"]}
    _lineage(events.evaluate, definition, outcome, sets["holdout"]["data_url"])
    return outcome


def evaluate(definition: PipelineDefinition, run: Any, best: Any, sets: Any) -> Any:
    """The candidate against the champion on the held-out days, by the definition's metric."""
    return _evaluate(str(definition.path), run, best, sets)


@task(task_id="training_serving_parity")
def _parity(path: str, run: dict[str, Any], best: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    from pipelines import lineage, parity

    definition = _definition(path)
    report = parity.check(
        _config(path, run), best["model_uri"], sets["train"]["manifest_url"], definition.tracking_uri
    )
    lineage.log_to_run(run["mlflow_run_id"], definition, report.metrics())
    return report.as_dict()


def training_serving_parity(definition: PipelineDefinition, run: Any, best: Any, sets: Any) -> Any:
    """The candidate sees online what it saw in training: features read from the online store and
    its predictions on them against the offline training-set path (publication waits for it)."""
    return _parity(str(definition.path), run, best, sets)


def approval(definition: PipelineDefinition) -> HITLOperator:
    """The approval gate in the Airflow UI (Required Actions), the comparison in its body."""
    model = definition.promotion.model
    return HITLOperator(
        task_id="approve",
        subject=f"Promote {model} version {{{{ ti.xcom_pull(task_ids='evaluate')['candidate']['version'] }}}}"
        f" to {definition.promotion.alias}?",
        body="{{ ti.xcom_pull(task_ids='evaluate')['summary'] }}",
        options=["Approve", "Reject"],
    )


@task(task_id="publish")
def _publish(
    path: str, run: dict[str, Any], verdict: dict[str, Any], approved: dict[str, Any] | None
) -> dict[str, Any]:
    from pipelines import publish as publication

    definition = _definition(path)
    context = get_current_context()
    outcome = publication.publish(
        definition,
        verdict,
        approval=approved,
        lineage_tags={
            "airflow.dag_id": context["dag_run"].dag_id,
            "airflow.run_id": context["dag_run"].run_id,
            "mlflow.parent_run_id": run["mlflow_run_id"],
            "gpuyard.job_id": verdict["job_id"],
        },
    )
    log.info(
        "%s: %s version %s: %s",
        "PROMOTED" if outcome["promoted"] else "REJECTED",
        definition.promotion.model,
        outcome["version"],
        outcome["reason"],
    )
    if not outcome["promoted"]:
        raise AirflowSkipException(f"not published: {outcome['reason']}")  # no model asset event
    context["outlet_events"][model_asset(definition)].extra = {
        "version": outcome["version"],
        "environment": outcome["environment"],
    }
    _lineage(events.publish, definition, verdict, outcome)
    return outcome


def publish(definition: PipelineDefinition, run: Any, verdict: Any, approved: Any = None) -> Any:
    """Move the alias, or tag the version rejected with the reason; a move is a model asset event."""
    return _publish.override(outlets=[model_asset(definition)])(str(definition.path), run, verdict, approved)


def _step_id(name: str, first: str) -> str:
    """The task that moves environment `name`: publication for the first, promote_<name> after it."""
    return "publish" if name == first else f"promote_{name}"


def environment_approval(definition: PipelineDefinition, name: str) -> HITLOperator:
    """A later environment's approval in the Airflow UI: the version the step before it moved, its
    metrics and who moved it, in the body. Unanswered within the environment's
    `approval_timeout_hours`, it answers Reject (the DAG runs one run at a time)."""
    promotion = definition.promotion
    environment = promotion.environment(name)
    before = promotion.names[promotion.names.index(name) - 1]
    moved = f"ti.xcom_pull(task_ids={_step_id(before, promotion.names[0])!r})"
    return HITLOperator(
        task_id=f"approve_{name}",
        subject=f"Promote {promotion.model} version {{{{ {moved}['version'] }}}} from {before} to {name}"
        f" (`{environment.alias}`{' in ' + environment.registry if environment.registry else ''})?",
        body=f"{{{{ {moved}['summary'] }}}}",
        options=["Approve", "Reject"],
        defaults=["Reject"],
        response_timeout=dt.timedelta(hours=environment.approval_timeout_hours),
    )


@task
def _promote(path: str, name: str, moved: dict[str, Any], approved: dict[str, Any] | None) -> dict[str, Any]:
    from pipelines import promotion

    definition = _definition(path)
    outcome = promotion.promote(definition, name, moved, approved)
    log.info(
        "%s: %s version %s to %s: %s",
        "PROMOTED" if outcome["promoted"] else "REJECTED",
        outcome["model"],
        outcome["version"],
        name,
        outcome["reason"],
    )
    if not outcome["promoted"]:
        raise AirflowSkipException(f"not promoted: {outcome['reason']}")  # no asset event
    context = get_current_context()
    context["outlet_events"][model_asset(definition, name)].extra = {
        "version": outcome["to_version"],
        "environment": name,
        "registry": outcome["registry"],
        "source_version": outcome["version"],
    }
    return outcome


def promotions(definition: PipelineDefinition, published: Any) -> list[Any]:
    """The promotion to each environment after the first, in order after `published`: its approval
    (when it requires one) and `promote_<name>`, which moves its alias (copied into its registry)
    and is an asset event of the model in that environment. A rejection skips the rest."""
    steps: list[Any] = []
    moved = published
    for environment in definition.promotion.environments[1:]:
        gate = environment_approval(definition, environment.name) if environment.requires_approval else None
        promote = _promote.override(
            task_id=f"promote_{environment.name}", outlets=[model_asset(definition, environment.name)]
        )(str(definition.path), environment.name, moved, gate.output if gate else None)
        if gate is not None:
            moved.operator >> gate >> promote.operator
            steps.append(gate)
        steps.append(promote.operator)
        moved = promote
    return steps


def failed_tasks(states: dict[str, Any]) -> list[str]:
    """The tasks of a run that failed themselves (not those left undone behind them), by Airflow's
    task states of the run."""
    return sorted(task for task, state in states.items() if state == "failed")


def _run_states(ti: Any) -> dict[str, Any]:
    return dict(ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {}))


@task(task_id="finish")
def _finish(path: str, run: dict[str, Any]) -> str:
    from pipelines import lineage

    failed = failed_tasks(_run_states(get_current_context()["ti"]))
    status = "FAILED" if failed else "FINISHED"
    definition = _definition(path)
    lineage.log_to_run(run["mlflow_run_id"], definition, {}, **{"pipeline.failed_tasks": failed})
    lineage.end_run(definition, run["mlflow_run_id"], status)
    return status


def finish(definition: PipelineDefinition, run: Any) -> Any:
    """Close the run's MLflow run: FINISHED, or FAILED naming the tasks that failed.

    `start`'s teardown: it runs whatever the work did (once `start` succeeded), and, a teardown, it
    does not decide the DAG run's state: the work's last tasks do, so a failed training fails the
    run. Wire it after the run's last tasks.
    """
    return _finish(str(definition.path), run).as_teardown(setups=run.operator)


def report_failure(context: Any) -> None:
    """The DAG-level failure callback: says which tasks failed the run.

    The DAG processor runs it with `ti`, the task that failed last, and Airflow's task states to
    ask; `airflow dags test` runs it in its own process with no supervisor to ask, and there the
    task that failed last is all it names.
    """
    ti = context.get("ti")
    if ti is None:  # Airflow found no failed task to hand over
        log.error("DAG run %s failed: %s", context.get("run_id"), context.get("reason"))
        return
    try:
        failed = failed_tasks(_run_states(ti))
    except NameError:  # no SUPERVISOR_COMMS: a callback of `airflow dags test`
        failed = [ti.task_id]
    log.error("DAG run %s of %s failed: failed tasks: %s", ti.run_id, ti.dag_id, ", ".join(failed))
