"""gpuyard data plane: the pipeline steps (ingest, prepare, validate, features, training set).

Each step module exposes one or two functions an Airflow task can call with a :class:`PipelineConfig`
(see ``pipelines/flights.yaml``). Heavy imports (Spark, Feast, Great Expectations) happen inside the
step modules, never here.
"""
