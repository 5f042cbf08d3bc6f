"""Each pipeline's landing check, an Airflow DAG built from its definition (pipelines/landings.py): on
the definition's schedule, it announces the newest landed raw flights partition to the pipeline's
retraining DAG, or ends skipped saying why (nothing new landed)."""

from __future__ import annotations

from pipelines.landings import landing_dags

landing_dags()  # each DAG registers itself with this file as it is built
