"""Who may do what on a pipeline's MLflow tracking server: its users and their grants (basic-auth app).

The server runs MLflow's `basic-auth` app with `default_permission = NO_PERMISSIONS`: a user sees and
changes only what it was granted (docs/security.md). Three kinds of user:

- `admin` (the platform operator's): creates the users below, nothing else uses it;
- `pipeline` (the pipeline's identity, in the Airflow processes' environment): MANAGE on every
  experiment and registered model, by one role; it creates the pipelines' experiments and
  registered models, grants the teams theirs, registers model versions and moves aliases;
- `team-<team>`, one per team: EDIT on the experiments of the pipelines it trains for, READ on their
  registered models. Its credentials are two secrets of the team's gpuyard secret store
  (`mlflow-username`, `mlflow-password`), which training jobs name in `env_from_secret`
  (`SECRET_ENV`): they reach the workers as MLFLOW_TRACKING_USERNAME/PASSWORD, by reference.

Training jobs log runs and models in their runs; they never write the registry (READ only), so a
team's job can move no alias: MLflow has no permission per alias, and creating a version and moving an
alias are the same `update` on the registered model, which only the pipeline holds.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from gpuyard_client import GpuyardClient

from training.mlflow_create import already_exists

log = logging.getLogger(__name__)

USERNAME_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
USERNAME_SECRET, PASSWORD_SECRET = "mlflow-username", "mlflow-password"
# a training job's env_from_secret
SECRET_ENV = {USERNAME_ENV: USERNAME_SECRET, PASSWORD_ENV: PASSWORD_SECRET}
ADMIN, PIPELINE = "admin", "pipeline"
PIPELINE_ROLE = "gpuyard-pipeline"
WORKSPACE = "default"  # without MLflow workspaces, roles live in the default one
CACHE_TTL_S = 300  # a checked password is trusted this long per worker (PBKDF2 costs ~0.7 s a request)


def team_user(team: str) -> str:
    """The MLflow user of a gpuyard team."""
    return f"team-{team}"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def env(self) -> dict[str, str]:
        """The variables MLflow's clients read them from."""
        return {USERNAME_ENV: self.username, PASSWORD_ENV: self.password}


def new_password() -> str:
    return secrets.token_urlsafe(24)  # 192 bits; MLflow asks for at least 12 characters


def from_environment(env: Mapping[str, str] = os.environ) -> Credentials | None:
    """The identity this process talks to MLflow as, or None (a server that asks for none)."""
    if env.get(USERNAME_ENV) and env.get(PASSWORD_ENV):
        return Credentials(env[USERNAME_ENV], env[PASSWORD_ENV])
    return None


def auth_config(database_uri: str, *, cache_ttl_s: int = CACHE_TTL_S) -> str:
    """The basic-auth app's configuration (MLFLOW_AUTH_CONFIG_PATH names its file): nothing for a user
    without a grant; the user store at `database_uri` (PostgreSQL in production). The admin's password
    comes from MLFLOW_AUTH_ADMIN_PASSWORD on the first start."""
    return (
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = {database_uri}\n"
        f"admin_username = {ADMIN}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "grant_default_workspace_access = false\n"
        f"auth_cache_ttl_seconds = {cache_ttl_s}\n"
    )


class AccessClient(httpx.Client):
    """The basic-auth app's REST API (users, roles, grants) as `credentials`."""

    def __init__(self, url: str, credentials: Credentials) -> None:
        super().__init__(
            base_url=url.rstrip("/"), auth=(credentials.username, credentials.password), timeout=60
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise AccessError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else {}

    def user_exists(self, username: str) -> bool:
        response = self.get("/api/2.0/mlflow/users/get", params={"username": username})
        return response.status_code == 200

    def ensure_user(self, credentials: Credentials) -> None:
        """Create the user, or give it this password (an admin's call)."""
        body = {"username": credentials.username, "password": credentials.password}
        if self.user_exists(credentials.username):
            self._call("PATCH", "/api/2.0/mlflow/users/update-password", json=body)
        else:
            self._call("POST", "/api/2.0/mlflow/users/create", json=body)

    def ensure_pipeline_role(self, username: str) -> None:
        """MANAGE on every experiment and registered model, by the role PIPELINE_ROLE (an admin's call)."""
        roles = self._call("GET", "/api/3.0/mlflow/roles/list", params={"workspace": WORKSPACE})["roles"]
        found = [r for r in roles if r["name"] == PIPELINE_ROLE]
        if found:
            role_id = found[0]["id"]
        else:
            role = self._call(
                "POST",
                "/api/3.0/mlflow/roles/create",
                json={"workspace": WORKSPACE, "name": PIPELINE_ROLE, "description": "gpuyard's pipelines"},
            )["role"]
            role_id = role["id"]
            for resource_type in ("experiment", "registered_model"):
                self._call(
                    "POST",
                    "/api/3.0/mlflow/roles/permissions/add",
                    json={
                        "role_id": role_id,
                        "resource_type": resource_type,
                        "resource_pattern": "*",
                        "permission": "MANAGE",
                    },
                )
        assigned = self._call("GET", "/api/3.0/mlflow/users/roles/list", params={"username": username})
        if role_id not in [r["id"] for r in assigned.get("roles", [])]:
            body = {"username": username, "role_id": role_id}
            self._call("POST", "/api/3.0/mlflow/roles/assign", json=body)

    def grant(self, username: str, resource_type: str, resource_id: str, permission: str) -> None:
        """`permission` on one resource (an experiment id, a registered model's name); needs MANAGE on it.
        Every DAG run grants again, and the server refuses a second grant on one resource: that refusal
        means the user holds the grant already (grant_team always gives the same levels). The pipeline
        may not read a user's permission to compare, nor revoke and grant again without a window in
        which a running job of the team is refused."""
        body = {"username": username, "resource_type": resource_type, "resource_id": resource_id}
        try:
            self._call(
                "POST", "/api/3.0/mlflow/users/permissions/grant", json=body | {"permission": permission}
            )
        except AccessError as error:
            if "RESOURCE_ALREADY_EXISTS" not in str(error):
                raise


class AccessError(RuntimeError):
    """The tracking server refused a call of its access API."""


def provision(url: str, admin: Credentials, pipeline: Credentials, teams: Mapping[str, Credentials]) -> None:
    """The platform operator's step: the pipeline's identity and one user per team, with these passwords."""
    with AccessClient(url, admin) as access:
        access.ensure_user(pipeline)
        access.ensure_pipeline_role(pipeline.username)
        for credentials in teams.values():
            access.ensure_user(credentials)


def hand_to_team(gpuyard: GpuyardClient, team: str, credentials: Credentials) -> None:
    """Store a team's MLflow credentials as its secrets, which its training jobs name (SECRET_ENV)."""
    gpuyard.put_secret(team, USERNAME_SECRET, credentials.username)
    gpuyard.put_secret(team, PASSWORD_SECRET, credentials.password)


def grant_team(url: str, team: str, experiment_id: str, model: str, pipeline: Credentials) -> None:
    """The pipeline's step before its training jobs: its registered model exists, and the team has EDIT
    on the experiment and READ on the model (the pipeline's own identity registers and moves aliases)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(url, registry_uri=url).create_registered_model(model)
    except MlflowException as error:
        if not already_exists(error):
            raise
    with AccessClient(url, pipeline) as access:
        access.grant(team_user(team), "experiment", experiment_id, "EDIT")
        access.grant(team_user(team), "registered_model", model, "READ")
    log.info("MLflow: %s may edit experiment %s and read model %s", team_user(team), experiment_id, model)
