"""The `gpuyard` connection: the API's URL in `host`, a team token in `password`.

`host` is a full URL (`http://gpuyard-api:8080`), or a host name completed by `port` and the
`scheme` extra (default `http`). The optional `ui_url` extra is where the job link points
(default: the API's own job resource; the gpuyard page in Airflow is `/gpuyard`), `mlflow_ui_url`
where the gpuyard page links a job's MLflow run. The token is the connection's password, which Airflow masks
in every log; the hook hands it to `gpuyard.client` and nowhere else. As an environment variable:

    AIRFLOW_CONN_GPUYARD_DEFAULT='{"conn_type": "gpuyard", "host": "http://127.0.0.1:8080", "password": "T"}'
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook, Connection

from gpuyard.client import AsyncGpuyardClient, Endpoint, GpuyardClient


class GpuyardConnectionError(ValueError):
    """A `gpuyard` connection lacks what the client needs; the message names the connection and field."""


def api_url_of(conn: Connection) -> str:
    """The gpuyard API's URL a `gpuyard` connection names."""
    host = (conn.host or "").strip().rstrip("/")
    if not host:
        raise GpuyardConnectionError(
            f"connection {conn.conn_id!r}: host must be the gpuyard API URL, e.g. http://127.0.0.1:8080"
        )
    if "://" not in host:
        scheme = conn.extra_dejson.get("scheme", "http")
        host = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
    return host


def endpoint_of(conn: Connection) -> Endpoint:
    """The client endpoint a `gpuyard` connection describes."""
    host = api_url_of(conn)
    if not conn.password:
        raise GpuyardConnectionError(
            f"connection {conn.conn_id!r}: password must hold a gpuyard team token (`gpuyard token create`)"
        )
    return Endpoint(url=host, token=conn.password)


def job_url(conn: Connection, job_id: str) -> str:
    """Where a person looks at a job: the `ui_url` extra's job page, else the API's job resource."""
    ui = conn.extra_dejson.get("ui_url")
    if ui:
        return f"{str(ui).rstrip('/')}/jobs/{job_id}"
    return f"{endpoint_of(conn).url}/v1/jobs/{job_id}"


class GpuyardHook(BaseHook):
    """Clients for the gpuyard API, built from a `gpuyard` connection."""

    conn_name_attr = "gpuyard_conn_id"
    default_conn_name = "gpuyard_default"
    conn_type = "gpuyard"
    hook_name = "gpuyard"

    def __init__(self, gpuyard_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.gpuyard_conn_id = gpuyard_conn_id

    def get_conn(self) -> GpuyardClient:
        return GpuyardClient(endpoint_of(self.get_connection(self.gpuyard_conn_id)))

    async def aendpoint(self) -> Endpoint:
        """The endpoint, read without blocking the event loop (the triggerer's way)."""
        return endpoint_of(await self.aget_connection(self.gpuyard_conn_id))

    async def aget_conn(self) -> AsyncGpuyardClient:
        return AsyncGpuyardClient(await self.aendpoint())

    def job_url(self, job_id: str) -> str:
        return job_url(self.get_connection(self.gpuyard_conn_id), job_id)

    def api_url(self) -> str:
        """The API's URL alone: the gpuyard page signs its callers in with their own tokens."""
        return api_url_of(self.get_connection(self.gpuyard_conn_id))

    def extra(self, key: str) -> str | None:
        value = self.get_connection(self.gpuyard_conn_id).extra_dejson.get(key)
        return None if value is None else str(value)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login"],
            "relabeling": {"host": "API URL", "password": "Token"},
            "placeholders": {
                "host": "http://127.0.0.1:8080",
                "password": "a team token (gpuyard token create --team TEAM)",
                "extra": '{"ui_url": "http://127.0.0.1:8080/ui"}',
            },
        }
