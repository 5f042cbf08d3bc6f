"""The gpuyard Airflow plugin: the one file Airflow imports from this plugins folder.

It registers the job link of GpuTrainingOperator and the gpuyard page: a FastAPI app mounted in
Airflow's API server at /gpuyard (`gpuyard.airflow.ui`), shown in Airflow's navigation as an external
view. The operator, hook and trigger need no registration: DAGs import them from the installed package
(`gpuyard.airflow`), and `plugins/.airflowignore` keeps Airflow from importing that package's modules
as plugins.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from gpuyard.airflow.links import GpuyardJobLink
from gpuyard.airflow.ui.mount import PageApp

PAGE_PREFIX = "/gpuyard"


class GpuyardPlugin(AirflowPlugin):
    name = "gpuyard"
    operator_extra_links = [GpuyardJobLink()]
    fastapi_apps = [{"app": PageApp(), "url_prefix": PAGE_PREFIX, "name": "gpuyard page"}]
    external_views = [
        {
            "name": "gpuyard",
            "href": f"{PAGE_PREFIX}/",
            "url_route": "gpuyard",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
