"""The administrative calls of the HTTP API (tokens, teams, quotas, admission policies, secrets), for the CLI.

A GpuyardClient with more methods, each a call that is safe to retry (reads, PUTs, DELETEs). Tokens are
created by `gpuyard token create` in the store itself (the bootstrap) or by POST /v1/tokens.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gpuyard_client import GpuyardClient


class AdminClient(GpuyardClient):
    def tokens(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens", params={"team": team} if team else None)  # type: ignore[no-any-return]

    def revoke_token(self, token_id: str) -> None:
        self._call("DELETE", f"/v1/tokens/{quote(token_id, safe='')}")

    def teams(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/teams")  # type: ignore[no-any-return]

    def team(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/teams/{quote(name, safe='')}")  # type: ignore[no-any-return]

    def set_quota(self, name: str, quota: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/teams/{quote(name, safe='')}/quota", json=quota)  # type: ignore[no-any-return]

    def set_policy(self, name: str, policy: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/teams/{quote(name, safe='')}/policy", json=policy)  # type: ignore[no-any-return]

    def secrets(self, team: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/teams/{quote(team, safe='')}/secrets")  # type: ignore[no-any-return]

    def delete_secret(self, team: str, name: str) -> None:
        self._call("DELETE", f"/v1/teams/{quote(team, safe='')}/secrets/{quote(name, safe='')}")
