"""Secrets by reference: written by team admins, named by jobs (`env_from_secret`), shown by nothing.

The end-to-end search of a planted secret through a running job (responses, events, logs, MLflow) is
in test_worker_isolation.py; this file covers the API, the store on disk and the Kubernetes objects.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
from control.conftest import EXAMPLE_SPEC, bearer
from fastapi.testclient import TestClient
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers.base import LaunchRequest
from gpuyard.launchers.kubernetes import manifests
from gpuyard.settings import Settings
from gpuyard.settings.kubernetes import KubernetesConfig
from gpuyard.store.tables import metadata
from sqlalchemy import Engine, select

PLANTED = "s3cr3t-planted-value-7f1e9c"


def store_dump(engine: Engine) -> str:
    with engine.connect() as conn:
        return "\n".join(repr(row) for table in metadata.sorted_tables for row in conn.execute(select(table)))


def test_team_admins_write_secrets_that_no_response_shows(
    api: TestClient, make_token: Callable[..., str], engine: Engine, settings: Settings
) -> None:
    member, admin, other = make_token("a"), make_token("a", "team-admin"), make_token("b", "team-admin")
    url = "/v1/teams/a/secrets/hf-token"
    assert api.put(url, json={"value": PLANTED}, headers=bearer(member)).status_code == 403
    assert api.put(url, json={"value": PLANTED}, headers=bearer(other)).status_code == 403
    written = api.put(url, json={"value": PLANTED}, headers=bearer(admin))
    assert written.status_code == 201 and written.json() == {"team": "a", "name": "hf-token"}
    assert api.put(url, json={"value": PLANTED}, headers=bearer(admin)).status_code == 200  # replaced
    assert api.get("/v1/teams/a/secrets", headers=bearer(member)).json() == [
        {"team": "a", "name": "hf-token"}
    ]
    assert api.get("/v1/teams/a/secrets", headers=bearer(other)).status_code == 404
    bad_name = api.put("/v1/teams/a/secrets/Bad_Name", json={"value": "x"}, headers=bearer(admin))
    assert bad_name.status_code == 422 and bad_name.json()["errors"][0]["path"] == "name"

    missing = {**EXAMPLE_SPEC, "env_from_secret": {"HF_TOKEN": "nope"}}
    refused = api.post("/v1/jobs", json=missing, headers=bearer(member))
    assert refused.status_code == 422
    assert refused.json()["errors"] == [
        {"path": "env_from_secret.HF_TOKEN", "rule": "team a has no secret named 'nope'"}
    ]
    spec = {**EXAMPLE_SPEC, "env_from_secret": {"HF_TOKEN": "hf-token"}}
    job = api.post("/v1/jobs", json=spec, headers=bearer(member))
    assert job.status_code == 201 and job.json()["spec"]["env_from_secret"] == {"HF_TOKEN": "hf-token"}
    other_team = {**spec, "team": "b"}
    assert api.post("/v1/jobs", json=other_team, headers=bearer(make_token("b"))).status_code == 422

    responses = [
        job.text,
        api.get(f"/v1/jobs/{job.json()['id']}", headers=bearer(member)).text,
        api.get("/v1/jobs", headers=bearer(member)).text,
        api.get("/v1/teams/a", headers=bearer(member)).text,
        api.get("/metrics").text,
    ]
    assert not [r for r in responses if PLANTED in r]
    assert PLANTED not in store_dump(engine)  # nor in any row: jobs, events, tokens, teams
    on_disk = settings.home / "secrets" / "a" / "hf-token"
    assert on_disk.read_text() == PLANTED
    assert stat.S_IMODE(on_disk.stat().st_mode) == 0o600
    assert stat.S_IMODE(on_disk.parent.stat().st_mode) == 0o700
    assert api.delete(url, headers=bearer(admin)).status_code == 204
    assert api.delete(url, headers=bearer(admin)).status_code == 404
    assert not on_disk.exists()


def test_pods_read_their_team_s_secrets_and_pull_secret_by_reference(tmp_path: Path) -> None:
    spec = parse_spec({**EXAMPLE_SPEC, "env_from_secret": {"HF_TOKEN": "hf-token"}})
    request = LaunchRequest(
        "att-1",
        "job-1",
        1,
        7,
        "s1",
        spec,
        Placement("s", "c", "d", (NodeSlice("n1", (0,)),)),
        "http://api",
        None,
    )
    owner = {"metadata": {"name": "gy-x", "uid": "5f0c1b7e-0000-4000-8000-000000000001"}}
    pod = manifests.build_pod(request, KubernetesConfig(image_pull_secrets=("mirror",)), 0, owner)
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    (container,) = pod["spec"]["containers"]
    hf = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert hf == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "gpuyard-team-a", "key": "hf-token"}},
    }
    assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror"}, {"name": "gpuyard-pull-a"}]
    other = manifests.build_pod(
        LaunchRequest(
            "att-2",
            "job-2",
            1,
            8,
            "s2",
            parse_spec({**EXAMPLE_SPEC, "team": "b"}),
            request.placement,
            "http://api",
            None,
        ),
        KubernetesConfig(),
        0,
        owner,
    )
    assert other["spec"]["imagePullSecrets"] == [{"name": "gpuyard-pull-b"}]  # never team a's
