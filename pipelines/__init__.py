"""gpuyard's model pipelines: the shared steps, and one definition (and folder) per model pipeline.

`definition.py` reads `pipelines/<name>/pipeline.yaml`; `sources.py` is the registry of data sources,
each defined in a pipeline's folder (`pipelines/<name>/source.py`, with its preparation: its Spark
jobs' scripts, its pandas engine); the step modules (ingest, prepare,
validate, features, training_set, evaluate, publish, lineage) are plain functions over a `PipelineConfig`;
`tasks.py` makes them Airflow tasks for the DAG files in `dags/`; `demo.py` and `ui.py` are
`make demo` and `make ui`. Heavy imports (Spark, Feast, Great Expectations, MLflow) happen inside the
step modules' functions, never here.
"""
