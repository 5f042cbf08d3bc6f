"""The gpuyard Airflow plugin: the one file Airflow imports from this plugins folder.

It registers the job link of GpuTrainingOperator. The operator, hook and trigger need no
registration: DAGs import them from the installed package (`gpuyard.airflow`), and
`plugins/.airflowignore` keeps Airflow from importing that package's modules as plugins.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from gpuyard.airflow.links import GpuyardJobLink


class GpuyardPlugin(AirflowPlugin):
    name = "gpuyard"
    operator_extra_links = [GpuyardJobLink()]
