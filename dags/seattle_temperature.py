"""seattle_temperature: retrain tomorrow's-temperature forecast, evaluate it against the champion, publish it.

Data engineers edit the definition, pipelines/seattle_temperature/pipeline.yaml (days, the window,
validation bounds, the grid, the promotion rule); this file only wires the shared steps
(pipelines/tasks.py) in their order. It runs once per raw day of Seattle's weather announced on its
raw asset, by the producer or by the daily landing check `seattle_temperature_landings`
(dags/landings.py), and from the UI with the Params form; `airflow dags test seattle_temperature`
runs it here.
"""

from __future__ import annotations

from airflow.sdk import DAG, chain

from pipelines import tasks as step
from pipelines.definition import load_definition

PIPELINE = load_definition("seattle_temperature")

with DAG(**step.retraining_dag(PIPELINE), doc_md=__doc__) as dag:
    run = step.start(PIPELINE)
    landed = step.ingest(PIPELINE, run)
    raw_checked = step.validate_raw(PIPELINE, run)
    prepared = step.prepare(PIPELINE)  # pandas: one row a day
    features_checked = step.validate_features(PIPELINE)
    applied = step.feast_apply(PIPELINE, run)
    materialized = step.materialize(PIPELINE, run)
    sets = step.training_set(PIPELINE, run)
    sets_checked = step.validate_training_set(PIPELINE, sets)
    candidates = step.train(PIPELINE, sets)  # one GPU job per grid entry
    best = step.pick_best(PIPELINE, sets, candidates)
    verdict = step.evaluate(PIPELINE, run, best, sets)
    gate = step.approval(PIPELINE) if PIPELINE.promotion.require_approval else None
    published = step.publish(PIPELINE, run, verdict, gate.output if gate else None)
    promoted = step.promotions(PIPELINE, published)  # approve_/promote_<env> after the first environment
    done = step.finish(PIPELINE, run)  # start's teardown: closes the MLflow run, whatever happened

    chain(landed, raw_checked, prepared, features_checked, applied, materialized, sets)
    chain(sets_checked, candidates)
    chain(verdict, *([gate] if gate else []), published, *promoted, done)
