"""Each team's admission policy (registries, digests, priority classes) refuses a job with a 422 naming
the rule; the GPU limits stay in the quota; production requires digests of every team."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from control.conftest import EXAMPLE_SPEC, bearer
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.domain.admission import image_repository
from gpuyard.settings import load_settings
from sqlalchemy import Engine

DIGEST = "@sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("python:3.11-slim", "docker.io/library/python"),
        ("pytorch/pytorch:2.3", "docker.io/pytorch/pytorch"),
        ("ghcr.io/acme/trainer:1.4" + DIGEST, "ghcr.io/acme/trainer"),
        ("registry.local:5000/team-a/x", "registry.local:5000/team-a/x"),
        ("localhost/x:1", "localhost/x"),
        ("GHCR.io/Acme/x", "ghcr.io/Acme/x"),
    ],
)
def test_an_image_names_its_registry_and_repository(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_a_team_s_policy_refuses_registries_tags_and_priority_classes(
    api: TestClient, make_token: Callable[..., str]
) -> None:
    member, admin = make_token("a"), make_token("platform", "platform-admin")
    policy = {"allowed_registries": ["ghcr.io/acme"], "require_digest": True, "allowed_priorities": ["low"]}
    assert api.put("/v1/teams/a/policy", json=policy, headers=bearer(member)).status_code == 403
    assert api.put("/v1/teams/nobody/policy", json=policy, headers=bearer(admin)).status_code == 404
    assert api.put("/v1/teams/a/policy", json=policy, headers=bearer(admin)).status_code == 200
    assert api.get("/v1/teams/a", headers=bearer(member)).json()["policy"] == {
        **policy,
        "checkpoint_roots": {},
    }

    refused = api.post("/v1/jobs", json=EXAMPLE_SPEC, headers=bearer(member))
    assert refused.status_code == 422
    rules = {e["rule"] for e in refused.json()["errors"]}
    assert {e["path"] for e in refused.json()["errors"]} == {"image", "priority"}
    assert "team a may use images from ['ghcr.io/acme'], not docker.io/library/python" in rules
    assert any("requires images pinned by digest" in r for r in rules)
    assert "team a may use priority classes ['low'], not 'normal'" in rules
    lookalike = {**EXAMPLE_SPEC, "image": "ghcr.io/acme-evil/x" + DIGEST, "priority": "low"}
    assert api.post("/v1/jobs", json=lookalike, headers=bearer(member)).json()["errors"][0]["path"] == "image"
    allowed = {**EXAMPLE_SPEC, "image": "ghcr.io/acme/trainer:1.4" + DIGEST, "priority": "low"}
    assert api.post("/v1/jobs", json=allowed, headers=bearer(member)).status_code == 201
    bad = api.put(
        "/v1/teams/a/policy", json={"allowed_registries": ["not a registry"]}, headers=bearer(admin)
    )
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "allowed_registries.0"


def test_the_quota_still_limits_gpus_per_job(api: TestClient, make_token: Callable[..., str]) -> None:
    admin, member = make_token("platform", "platform-admin"), make_token("a")
    api.put("/v1/teams/a/quota", json={"max_gpus_per_job": 1, "gpu_quota": 2}, headers=bearer(admin))
    two = {**EXAMPLE_SPEC, "resources": {"gpus": 2, "gpu_types": ["cpu"]}}
    refused = api.post("/v1/jobs", json=two, headers=bearer(member))
    assert refused.status_code == 422 and refused.json()["errors"][0]["path"] == "resources.gpus"
    assert "at most 1 GPUs per job" in refused.text


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_production_requires_a_digest_whatever_the_team_says(
    database_url: str, engine: Engine, make_token: Callable[..., str], tmp_path: Path
) -> None:
    production = load_settings(
        home=tmp_path / "prod",
        profile="production",
        database_url=database_url,
        redis_url="redis://127.0.0.1:6379/0",
        checkpoint_store="s3://ckpt",
    )
    spec = {**EXAMPLE_SPEC, "checkpoint": {"url": "s3://ckpt/a/flights"}}
    with TestClient(create_app(production, engine)) as api:
        member = make_token("a")
        tagged = api.post("/v1/jobs", json=spec, headers=bearer(member))
        assert tagged.status_code == 422
        assert "this platform requires images pinned by digest" in tagged.json()["errors"][0]["rule"]
        pinned = {**spec, "image": "python:3.11-slim" + DIGEST}
        assert api.post("/v1/jobs", json=pinned, headers=bearer(member)).status_code == 201
