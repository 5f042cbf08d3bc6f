"""The extra link on a training task: opens the gpuyard job the task follows.

The operator pushes the job id to XCom (`gpuyard_job_id`) as soon as it knows it; Airflow asks the
link on the worker when the task instance ends or defers and stores the URL for the UI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

from gpuyard_provider.hooks.gpuyard import GpuyardHook

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

JOB_ID_XCOM = "gpuyard_job_id"


class GpuyardJobLink(BaseOperatorLink):
    name = "gpuyard job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        job_id = XCom.get_value(ti_key=ti_key, key=JOB_ID_XCOM)
        if not job_id:
            return ""
        conn_id = getattr(operator, "gpuyard_conn_id", GpuyardHook.default_conn_name)
        return GpuyardHook(conn_id).job_url(str(job_id))
