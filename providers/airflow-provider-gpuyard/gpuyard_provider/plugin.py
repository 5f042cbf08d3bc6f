"""The gpuyard Airflow plugin, registered by the provider's `airflow.plugins` entry point: installing
the provider is all a deployment does to have it.

It registers the job link of GpuTrainingOperator and the gpuyard page: a FastAPI app mounted in
Airflow's API server at /gpuyard (`gpuyard_provider.ui`), shown in Airflow's navigation as an external
view. The operator, hook and trigger need no plugin: DAGs import them from the provider, and Airflow
finds the connection type through the provider's info (`get_provider_info`).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from gpuyard_provider.links import GpuyardJobLink
from gpuyard_provider.ui.mount import PageApp

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
