"""The `gpuyard` connection: the API's URL in `host`, a team token in `password`.

`host` is a full URL (`http://gpuyard-api:8080`), or a host name completed by `port` and the
`scheme` extra (default `http`). The optional `ui_url` extra is where the job link points
(default: the API's own job resource; the gpuyard page in Airflow is `/gpuyard`), `mlflow_ui_url`
where the gpuyard page links a job's MLflow run. The token is the connection's password, which Airflow masks
in every log; the hook hands it to `gpuyard_client` and nowhere else. As an environment variable:

    AIRFLOW_CONN_GPUYARD_DEFAULT='{"conn_type": "gpuyard", "host": "http://127.0.0.1:8080", "password": "T"}'

The connection form (its labels, hidden fields and extra fields) is declared in the provider's info
(`gpuyard_provider.get_provider_info`), as Airflow 3.2+ reads it without importing the hook.
"""

from __future__ import annotations

import httpx
from airflow.sdk import BaseHook, Connection
from gpuyard_client import ApiError, ApiUnreachable, AsyncGpuyardClient, Endpoint, GpuyardClient

TEST_TIMEOUT_S = 10.0  # the UI's Test button waits this long for the API at most: no outage is ridden out


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
        scheme = conn.extra_dejson.get("scheme") or "http"
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

    def test_connection(self) -> tuple[bool, str]:
        """What the UI's Test button says (`[core] test_connection = Enabled`): whether the API at the
        connection's URL takes its token, asked once (`GET /v1/whoami`), without riding out an outage."""
        try:
            endpoint = endpoint_of(self.get_connection(self.gpuyard_conn_id))
            with GpuyardClient(endpoint, timeout_s=TEST_TIMEOUT_S, retry_for_s=0.0) as client:
                caller = client.whoami()
        except GpuyardConnectionError as error:
            return False, str(error)
        except ApiError as error:
            return False, f"the gpuyard API at {endpoint.url} refused the token: {error}"
        except httpx.HTTPError as error:
            said = error.__cause__ if isinstance(error, ApiUnreachable) and error.__cause__ else error
            return False, f"the gpuyard API at {endpoint.url} did not answer: {type(said).__name__}: {said}"
        return True, (
            f"the gpuyard API at {endpoint.url} takes the token: team {caller['team']}, "
            f"role {caller['role']}, expires {caller['expires_at']}"
        )
