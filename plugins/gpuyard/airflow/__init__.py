"""gpuyard's Airflow integration, laid out as the official providers are.

`hooks.gpuyard` owns the `gpuyard` connection (API URL and token) over the HTTP client,
`operators.training` the deferrable GpuTrainingOperator, `triggers.job` the trigger that follows a
job's events (`triggers.followers`: one long poll for every job a process follows), `narration` how
a job's events read in the task log, `links` the extra link that opens a job. Everything here talks
to the control plane through `gpuyard.client` only. The thin plugin that Airflow loads is
`plugins/gpuyard_plugin.py`.
"""
