"""A pipeline's landing check: the scheduled DAG that tells its retraining DAG which raw day is due.

The retraining DAG (dags/<name>.py, DAG id = the pipeline's name) runs once per raw
partition announced on its raw asset (`tasks.schedule`, a `PartitionedAssetTimetable`): the run for
partition key D trains through D. A producer that lands a day may announce it itself (an asset event
with partition key D). For every other landing this DAG runs on the definition's `schedule` (a
`CronPartitionTimetable`: its run at the tick of day D has partition key D). It finds the newest raw
flights partition landed on or before D and announces it (an event on the raw asset with that
partition key), unless that partition already has a retraining run that did not fail; otherwise it
ends skipped, with the reason in its log.

Why two DAGs: Airflow 3.3 has no partitioned `AssetOrTimeSchedule`, and a cron run of the retraining
DAG would have no day of its own to train on. Here every retraining run is a partition's, whoever
announced it, and the time-based half only decides which partition is due.

dags/landings.py builds one per definition under pipelines/ (`<name>_landings`); a definition
without a schedule gets none (it runs by data and by hand only).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from typing import Any

from airflow.sdk import DAG, CronPartitionTimetable, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from pipelines import storage
from pipelines.definition import DEFINITION_FILE, PIPELINES, PipelineDefinition, load_definition
from pipelines.tasks import raw_asset

log = logging.getLogger(__name__)
KEY_FORMAT = "%Y-%m-%d"  # a partition key is a day, as the landing zone names its partitions


def newest_landed(definition: PipelineDefinition, day: dt.date) -> dt.date | None:
    """The newest partition of the source's announced raw table landed on or before `day` (None: none has)."""
    table = definition.source.announced
    landed = storage.list_partitions(storage.join(definition.data.root, "raw", table))
    due = [d for d in landed if d <= day]
    return due[-1] if due else None


def retraining_runs(events: Iterable[Any], day: dt.date, dag_id: str) -> list[str]:
    """The runs of `dag_id` that raw asset events of partition `day` created and that did not fail."""
    return sorted(
        {
            run.run_id
            for event in events
            if event.partition_key == day.isoformat()
            for run in event.created_dagruns
            if run.dag_id == dag_id and run.state != "failed"
        }
    )


@task(task_id="announce")
def _announce(path: str) -> str:
    context = get_current_context()
    definition = load_definition(path)
    asset = raw_asset(definition)
    key = context.get("partition_key")  # None in a run triggered without one (`airflow dags test`)
    day = dt.date.fromisoformat(key) if key else context["dag_run"].run_after.date()
    newest, table = newest_landed(definition, day), definition.source.announced
    if newest is None:
        raise AirflowSkipException(f"nothing new: no raw {table} partition landed on or before {day}")
    runs = retraining_runs(context["inlet_events"][asset], newest, definition.name)
    if runs:
        raise AirflowSkipException(
            f"nothing new: {newest}, the newest raw {table} partition landed on or before {day}, "
            f"already has retraining run(s) {', '.join(runs)}"
        )
    context["outlet_events"][asset].add_partitions(newest.isoformat())
    log.info("announced raw %s partition %s, the newest landed on or before %s", table, newest, day)
    return newest.isoformat()


def landing_dag(definition: PipelineDefinition) -> DAG | None:
    """The definition's landing check (None when it has no schedule)."""
    if definition.schedule is None:
        return None
    asset = raw_asset(definition)
    with DAG(
        dag_id=f"{definition.name}_landings",
        description=f"Announces the newest landed raw partition to {definition.name}",
        schedule=CronPartitionTimetable(definition.schedule, timezone="UTC", key_format=KEY_FORMAT),
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,  # one check at a time: two could announce the same partition
        # a check that fails on its way (its process starved, the API slow to answer) tries again: a
        # failed check would leave a landed day unannounced until the next tick
        default_args={"owner": definition.owner, "retries": 1, "retry_delay": dt.timedelta(seconds=30)},
        tags=["gpuyard", "landings"],
        doc_md=__doc__,
    ) as dag:
        _announce.override(inlets=[asset], outlets=[asset])(str(definition.path))
    return dag


def landing_dags() -> list[DAG]:
    """The landing checks of the definitions under pipelines/ (pipelines/<name>/pipeline.yaml)."""
    built = (landing_dag(load_definition(path)) for path in sorted(PIPELINES.glob(f"*/{DEFINITION_FILE}")))
    return [dag for dag in built if dag is not None]
