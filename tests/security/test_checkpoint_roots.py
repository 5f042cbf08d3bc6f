"""Checkpoint roots belong to teams: a job names, a worker records and the scheduler copies only
checkpoints under its team's roots (domain/checkpoint_roots.py); production keeps them in object stores."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from control.conftest import EXAMPLE_SPEC, bearer
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.clock import utcnow
from gpuyard.domain.checkpoint_roots import is_under
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node, Site
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.settings import Settings, SettingsError, load_settings
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine

ROOT = "s3://ckpt-east/a"

HOSTILE = [
    "s3://ckpt-east/a-evil/x",  # a longer name is not a folder inside
    "s3://ckpt-east/ab",
    "s3://ckpt-east/b/x",
    "s3://ckpt-east/a/../b/x",  # dot segments, plain and encoded (once, twice, either case)
    "s3://ckpt-east/a/./../b",
    "s3://ckpt-east/a/%2e%2e/b",
    "s3://ckpt-east/a/%2E%2e/b",
    "s3://ckpt-east/a/%252e%252e/b",
    "s3://ckpt-east/a%2F..%2Fb",  # an encoded separator
    "s3://ckpt-east/a/x%2F..%2F..%2Fb",
    "s3://ckpt-east/a/..%5c..%5cb",  # an encoded backslash
    "s3://ckpt-east/a/x%00",
    "gs://ckpt-east/a/x",  # another scheme, bucket, host, userinfo or port
    "s3a://ckpt-east/a/x",
    "s3://ckpt-west/a/x",
    "s3://ckpt-east.evil/a/x",
    "s3://evil@ckpt-east/a/x",
    "s3://ckpt-east:443/a/x",
    "s3://ckpt-east/a/x?versionId=1",  # queries, fragments, chained protocols, whitespace
    "s3://ckpt-east/a/x#frag",
    "simplecache::s3://ckpt-east/a/x",
    "s3://ckpt-east/a/.\n./b",
    "s3://ckpt-east/a/x y",
    "s3://ckpt-east//a/x",
    "s3://ckpt-east",
    "s3:/ckpt-east/a/x",
    "ckpt-east/a/x",
]


@pytest.mark.parametrize("url", HOSTILE)
def test_a_url_beside_or_outside_a_root_is_not_under_it(url: str) -> None:
    assert not is_under(url, ROOT) and not is_under(url, ROOT + "/")


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("s3://ckpt-east/a", ROOT),
        ("s3://ckpt-east/a/", ROOT),
        ("s3://ckpt-east/a/job-1/step-000000120", ROOT + "/"),
        ("s3://ckpt-east/a/job-1/", ROOT),
        ("s3://ckpt-east/a/x..y/z", ROOT),  # dots inside a name are a name
        ("s3://ckpt-east/a/x", "s3://ckpt-east"),
        ("file:///data/ckpt/a/run", "file:///data/ckpt/a"),
    ],
)
def test_a_folder_and_what_lies_in_it_are_under_it(url: str, root: str) -> None:
    assert is_under(url, root)


def _resolved(url: str) -> str:
    """What a store that decodes and resolves dot segments would open: the oracle."""
    path = url.split("://", 1)[1].split("/", 1)[1] if "/" in url.split("://", 1)[1] else ""
    for _ in range(8):
        path = unquote(path)
    return posixpath.normpath("/" + path)


SEGMENT = st.one_of(
    st.sampled_from([".", "..", "%2e", "%2E%2e", "%252e%252e", "%2F", "%5c", "a", "a-evil", "b", "x", ""]),
    st.text(alphabet="a.-_%2eF/\\", min_size=1, max_size=6),
)


@given(st.sampled_from([ROOT, ROOT + "/", "s3://ckpt-east"]), st.lists(SEGMENT, min_size=1, max_size=6))
def test_no_url_said_to_be_under_a_root_opens_outside_it(start: str, segments: list[str]) -> None:
    url = start.rstrip("/") + "/" + "/".join(segments)
    if is_under(url, ROOT):
        assert _resolved(url) == "/a" or _resolved(url).startswith("/a/"), url


@given(st.lists(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,12}", fullmatch=True), max_size=5))
def test_plain_names_under_a_root_are_under_it(names: list[str]) -> None:
    names = [n for n in names if n not in (".", "..")]
    assert is_under("/".join([ROOT, *names]), ROOT)


def two_sites() -> Fleet:
    return Fleet(
        nodes=tuple(
            Node(name=f"{site}-1", site=site, cluster="c", domain="d", gpu_type="cpu", gpus=2)
            for site in ("east", "west")
        ),
        sites=(
            Site(name="east", checkpoint_store="s3://ckpt-east"),
            Site(name="west", checkpoint_store="s3://ckpt-west/"),
        ),
    )


def with_checkpoint(url: str, **changes: object) -> dict[str, object]:
    return {**EXAMPLE_SPEC, "checkpoint": {"url": url}, **changes}


def test_a_job_names_only_checkpoints_under_its_team_s_roots(
    settings: Settings, engine: Engine, make_token: Callable[..., str]
) -> None:
    """Each site's default root is `<its store>/<team>`; a platform admin may name others per site."""
    member, admin = make_token("a"), make_token("platform", "platform-admin")
    make_token("b")
    with TestClient(create_app(settings, engine, fleet=two_sites())) as api:

        def submit(url: str, **changes: object) -> tuple[int, list[dict[str, str]]]:
            answer = api.post("/v1/jobs", json=with_checkpoint(url, **changes), headers=bearer(member))
            return answer.status_code, answer.json().get("errors", [])

        for url in ("s3://ckpt-east/b/theirs", "s3://ckpt-east/a-evil/x", "s3://ckpt-east/a/../b/x"):
            status, errors = submit(url)
            assert status == 422 and errors[0]["path"] == "checkpoint.url", (url, errors)
            assert "team a's checkpoint roots ['s3://ckpt-east/a', 's3://ckpt-west/a']" in errors[0]["rule"]
        assert submit("s3://ckpt-east/a/mine")[0] == 201
        assert submit("s3://ckpt-west/a/mine/")[0] == 201
        status, errors = submit("s3://ckpt-west/a/mine", sites=["east"])  # the roots of its sites only
        assert status == 422 and "['s3://ckpt-east/a']" in errors[0]["rule"]

        policy = {"checkpoint_roots": {"east": ["gs://vision-ckpt/a", "gs://shared/a-team"]}}
        assert api.put("/v1/teams/a/policy", json=policy, headers=bearer(admin)).status_code == 200
        assert (
            api.get("/v1/teams/a", headers=bearer(member)).json()["policy"]["checkpoint_roots"]
            == policy["checkpoint_roots"]
        )
        assert submit("gs://shared/a-team/run", sites=["east"])[0] == 201
        status, errors = submit("s3://ckpt-east/a/mine", sites=["east"])  # the default gave way
        assert status == 422 and "['gs://vision-ckpt/a', 'gs://shared/a-team']" in errors[0]["rule"]
        bad = api.put(
            "/v1/teams/a/policy",
            json={"checkpoint_roots": {"east": ["s3://x/a/../b"]}},
            headers=bearer(admin),
        )
        assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "checkpoint_roots.east.0"
        assert api.put("/v1/teams/a/policy", json=policy, headers=bearer(member)).status_code == 403


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_records_only_checkpoints_under_its_job_s_roots(settings: Settings, engine: Engine) -> None:
    """Its spec's URL, or its folder under its team's roots (where a move puts it): not team b's."""
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=2, max_gpus_per_job=2), utcnow())
    spec = parse_spec(with_checkpoint("s3://ckpt-east/a/mine"))
    job, _ = job_store.submit(engine, spec, idempotency_key=None, created_by="t", at=utcnow())
    placement = Placement("east", "c", "d", (NodeSlice("east-1", (0,)),))
    (attempt,) = reserve_batch(engine, [Reservation(job.id, placement, False)], at=utcnow(), lease_ttl_s=600)
    assert attempt is not None
    with TestClient(create_app(settings, engine, fleet=two_sites())) as api:

        def record(url: str, step: int) -> int:
            body = {"fencing_token": attempt.fencing_token, "checkpoint": {"url": url, "step": step}}
            proof = {"Authorization": f"Bearer {attempt.attempt_secret}"}
            return api.post(f"/v1/attempts/{attempt.id}/heartbeat", json=body, headers=proof).status_code

        for url in (
            "s3://ckpt-east/b/theirs/step-1",
            "s3://ckpt-east/a/other-job/step-1",  # its team's, but not its job's
            "s3://ckpt-east/a/mine/../../b/theirs",
            f"s3://ckpt-east/{job.id}/step-1",  # where a site store's folder was before roots were teams'
        ):
            assert record(url, 1) == 422, url
        assert record("s3://ckpt-east/a/mine/step-2", 2) == 200
        assert record(f"s3://ckpt-west/a/{job.id}/step-3", 3) == 200
    with engine.connect() as conn:
        found = job_store.get(conn, job.id)
    assert found is not None and found.checkpoint_url == f"s3://ckpt-west/a/{job.id}/step-3"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_production_keeps_checkpoints_in_object_stores_under_roots_it_names(
    database_url: str, engine: Engine, make_token: Callable[..., str], tmp_path: Path
) -> None:
    def production(**changes: object) -> Settings:
        return load_settings(
            home=tmp_path / "prod",
            profile="production",
            database_url=database_url,
            redis_url="redis://127.0.0.1:6379/0",
            **changes,
        )

    with pytest.raises(SettingsError, match=r"checkpoint_store: profile production keeps checkpoints in an"):
        production(checkpoint_store="file:///var/ckpt")
    # The local launcher's workers share this machine's disk (the fault suite runs so).
    assert production(checkpoint_store="file:///var/ckpt", launcher="local").checkpoint_store
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "n", "site": "east", "cluster": "c", "domain": "d", "gpu_type": "cpu", "gpus": 1}
                ],
                "sites": [{"name": "east", "checkpoint_store": "file:///var/ckpt"}],
            }
        )
    )
    with pytest.raises(SettingsError, match=r"sites.east.checkpoint_store: profile production keeps"):
        production(fleet_file=str(fleet)).fleet()
    digest = "python:3.11-slim@sha256:" + "ab" * 32
    member, admin = make_token("a"), make_token("platform", "platform-admin")
    with TestClient(create_app(production(), engine)) as api:  # no store named: no team has roots
        refused = api.post(
            "/v1/jobs", json=with_checkpoint("s3://ckpt/a/x", image=digest), headers=bearer(member)
        )
        assert refused.status_code == 422
        assert "team a has no checkpoint root at every site" in refused.json()["errors"][0]["rule"]
        local = {"checkpoint_roots": {"local": ["file:///var/ckpt/a"]}}
        answer = api.put("/v1/teams/a/policy", json=local, headers=bearer(admin))
        assert answer.status_code == 422 and answer.json()["errors"][0]["path"] == "checkpoint_roots.local.0"
    with TestClient(create_app(production(checkpoint_store="s3://ckpt"), engine)) as api:
        spec = with_checkpoint("s3://ckpt/a/x", image=digest)
        assert api.post("/v1/jobs", json=spec, headers=bearer(member)).status_code == 201
        local_url = with_checkpoint("file:///tmp/gpuyard-ckpt/a", image=digest)
        refused = api.post("/v1/jobs", json=local_url, headers=bearer(member))
        assert refused.status_code == 422
        assert "keeps checkpoints in an object store" in refused.json()["errors"][0]["rule"]
