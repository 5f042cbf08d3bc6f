"""gpuyard's Airflow provider (the `airflow-provider-gpuyard` distribution), laid out as the official
providers are.

`hooks.gpuyard` owns the `gpuyard` connection (API URL and token) over the HTTP client,
`operators.training` the deferrable GpuTrainingOperator, `triggers.job` the trigger that follows a
job's events (`triggers.followers`: one long poll for every job a process follows), `narration` how
a job's events read in the task log, `links` the extra link that opens a job, `ui` the gpuyard page
and `plugin` the Airflow plugin that mounts it. Everything here talks to the control plane through
`gpuyard_client` only. Airflow finds the provider through `get_provider_info` (the
`apache_airflow_provider` entry point) and the plugin through the `airflow.plugins` entry point.
"""

__version__ = "0.1.0"
