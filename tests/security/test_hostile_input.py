"""Hostile input is a 422 naming what is wrong, never a 500, on SQLite and on PostgreSQL.

Integers are bounded at the edge, floats are finite, strings hold only what PostgreSQL can store (no
NUL, no lone surrogate), and a job cannot set the variables that decide which GPUs it sees.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from control.conftest import EXAMPLE_SPEC, bearer
from fastapi.testclient import TestClient


def raw(api: TestClient, method: str, url: str, body: str, token: str) -> Any:
    """Send `body` as written: JSON's Infinity, 1e400 and lone surrogates survive no client encoder."""
    return api.request(
        method, url, content=body.encode(), headers=bearer(token, **{"content-type": "application/json"})
    )


def paths(response: Any) -> set[str]:
    assert response.status_code == 422, response.text
    return {e["path"] for e in response.json()["errors"]}


def test_a_cursor_past_the_store_s_integers_is_refused(
    api: TestClient, make_token: Callable[..., str]
) -> None:
    token = make_token("a")
    huge = base64.urlsafe_b64encode(str(10**40).encode()).decode().rstrip("=")
    assert paths(api.get("/v1/jobs", params={"cursor": huge}, headers=bearer(token))) == {"cursor"}
    largest = base64.urlsafe_b64encode(str(2**63 - 1).encode()).decode().rstrip("=")
    assert api.get("/v1/jobs", params={"cursor": largest}, headers=bearer(token)).status_code == 200


def test_an_infinite_weight_is_refused_and_the_summary_still_answers(
    api: TestClient, make_token: Callable[..., str]
) -> None:
    admin = make_token("platform", "platform-admin")
    for weight in ("Infinity", "NaN", "1e400", "1001"):
        body = f'{{"gpu_quota": 2, "weight": {weight}}}'
        assert paths(raw(api, "PUT", "/v1/teams/a/quota", body, admin)) == {"weight"}, weight
    assert api.put("/v1/teams/a/quota", json={"weight": 1000}, headers=bearer(admin)).status_code == 201
    summary = api.get("/v1/metrics/summary", headers=bearer(make_token("a")))
    assert summary.status_code == 200, summary.text


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/v1/jobs/job-%00"),
        ("GET", "/v1/jobs?team=a%00"),
        ("GET", "/v1/jobs/x%00/logs"),
        ("POST", "/v1/jobs/x%00/cancel"),
        ("GET", "/v1/teams/a%00"),
        ("GET", "/v1/tokens?team=%00"),
        ("DELETE", "/v1/tokens/%00"),
        ("POST", "/v1/attempts/a%00/heartbeat"),
    ],
)
def test_nul_in_a_path_or_query_is_refused_before_the_store_sees_it(
    api: TestClient, make_token: Callable[..., str], method: str, url: str
) -> None:
    response = api.request(method, url, headers=bearer(make_token("platform", "platform-admin")))
    assert response.status_code == 422, response.text
    assert "NUL" in response.json()["detail"]


def test_token_descriptions_fit_the_store(api: TestClient, make_token: Callable[..., str]) -> None:
    admin = make_token("platform", "platform-admin")
    for description in ("x" * 201, "a\u0000b"):
        body = {"team": "a", "description": description}
        assert paths(api.post("/v1/tokens", json=body, headers=bearer(admin))) == {"description"}
    fits = api.post("/v1/tokens", json={"team": "a", "description": "x" * 200}, headers=bearer(admin))
    assert fits.status_code == 201, fits.text


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, "reserved"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "reserved"),
        ({"MASTER_ADDR": "10.0.0.9"}, "reserved"),
        ({"GPUYARD_FENCING_TOKEN": "1"}, "reserved"),
        ({"HF_TOKEN": "hf_x"}, "env_from_secret"),
        ({"AWS_SECRET_ACCESS_KEY": "x"}, "env_from_secret"),
        ({"OPENAI_API_KEY": "x"}, "env_from_secret"),
    ],
)
def test_a_job_cannot_set_what_the_launcher_owns_nor_a_plain_credential(
    api: TestClient, make_token: Callable[..., str], env: dict[str, str], fragment: str
) -> None:
    response = api.post("/v1/jobs", json={**EXAMPLE_SPEC, "env": env}, headers=bearer(make_token("a")))
    assert paths(response) == {"env"} and fragment in response.text
    harmless = {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "INFO"}
    ok = api.post("/v1/jobs", json={**EXAMPLE_SPEC, "env": harmless}, headers=bearer(make_token("a")))
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ('"max_runtime": 1e400', "max_runtime"),
        ('"max_runtime": "' + "9" * 400 + 'd"', "max_runtime"),
        ('"max_runtime": "400d"', "max_runtime"),
        ('"retry": {"backoff": Infinity}', "retry.backoff"),
        ('"resources": {"gpus": 1, "gpu_types": ["cpu"], "cpu": 1e400}', "resources.cpu"),
        (
            '"resources": {"gpus": 1, "gpu_types": ["cpu"], "memory": "' + "9" * 30 + 'Ti"}',
            "resources.memory",
        ),
        ('"reproducibility": {"seed": ' + str(2**64) + "}", "reproducibility.seed"),
        ('"retry": {"retryable_exit_codes": [' + str(10**20) + "]}", "retry.retryable_exit_codes.0"),
        ('"labels": {"team-note": "\\ud800"}', "labels.team-note"),
        ('"command": ["python", "\\udfff"]', "command.1"),
    ],
)
def test_numbers_are_bounded_and_finite_and_strings_storable(
    api: TestClient, make_token: Callable[..., str], change: str, path: str
) -> None:
    document = json.dumps({k: v for k, v in EXAMPLE_SPEC.items() if k not in ("resources", "retry")})
    body = document[:-1] + ", " + change + "}"
    if '"resources"' not in change:
        body = body[:-1] + ', "resources": {"gpus": 1, "gpu_types": ["cpu"]}}'
    assert paths(raw(api, "POST", "/v1/jobs", body, make_token("a"))) == {path}
