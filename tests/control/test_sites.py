"""Sites: a job placed away from its newest checkpoint gets a verified copy before it starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from gpuyard.checkpoint_transfer import TransferError, copy_checkpoint
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node, Site
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.states import AttemptState
from gpuyard.scheduler.service import SchedulerService
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from sqlalchemy import Engine
from stores import report_checkpoint

from .test_scheduler_service import Clock, RecordingLauncher, spec, submit


def write_checkpoint(directory: Path, step: int, *, corrupt: bool = False) -> str:
    """A checkpoint in the training runtime's layout: data files, then a manifest with checksums."""
    files = {"state/__0_0.distcp": b"\x00weights" * 1000, "rng/rank-0.pt": b"rng", "trainer.pt": b"trainer"}
    entries = {}
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entries[name] = {
            "sha256": hashlib.sha256(data if not corrupt else b"other").hexdigest(),
            "size": len(data),
        }
    (directory / "manifest.json").write_text(json.dumps({"step": step, "files": entries}))
    return directory.as_uri()


def test_copy_verifies_every_file_and_the_manifest(tmp_path: Path) -> None:
    source = write_checkpoint(tmp_path / "east" / "step-000000120", 120)
    transfer = copy_checkpoint(source, (tmp_path / "west" / "step-000000120").as_uri())
    assert transfer.files == 4 and transfer.bytes > 8000
    for name in ("state/__0_0.distcp", "rng/rank-0.pt", "trainer.pt", "manifest.json"):
        assert (tmp_path / "west" / "step-000000120" / name).read_bytes() == (
            tmp_path / "east" / "step-000000120" / name
        ).read_bytes()
    bad = write_checkpoint(tmp_path / "east" / "step-000000130", 130, corrupt=True)
    with pytest.raises(TransferError, match="does not match the manifest"):
        copy_checkpoint(bad, (tmp_path / "west" / "step-000000130").as_uri())
    with pytest.raises(TransferError, match="does not exist"):
        copy_checkpoint((tmp_path / "nowhere").as_uri(), (tmp_path / "x").as_uri())
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(TransferError, match=r"copying .* to .*a-file/step"):
        copy_checkpoint(source, (tmp_path / "a-file" / "step").as_uri())


def test_a_checkpoint_travels_to_an_object_store_and_back(tmp_path: Path, s3_bucket: str) -> None:
    """Between sites whose stores are S3 buckets (moto's server over HTTP), verified both ways."""
    source = write_checkpoint(tmp_path / "east" / "step-000000120", 120)
    there = copy_checkpoint(source, f"{s3_bucket}/a/job-1/step-000000120")
    assert there.files == 4
    back = copy_checkpoint(f"{s3_bucket}/a/job-1/step-000000120", (tmp_path / "west" / "step").as_uri())
    assert back.files == 4 and back.bytes == there.bytes
    for name in ("state/__0_0.distcp", "rng/rank-0.pt", "trainer.pt", "manifest.json"):
        assert (tmp_path / "west" / "step" / name).read_bytes() == (
            tmp_path / "east" / "step-000000120" / name
        ).read_bytes()
    with pytest.raises(TransferError, match="does not exist"):
        copy_checkpoint(f"{s3_bucket}/a/job-1/step-000000999", (tmp_path / "x").as_uri())


@pytest.mark.parametrize("case", ["intact", "corrupt", "another team's"])
def test_a_job_moved_to_another_site_resumes_from_a_verified_copy(
    engine: Engine, tmp_path: Path, case: str
) -> None:
    """Into the job's folder under its team's root at the new site (`<west store>/a/<job id>`). The
    scheduler copies with its own credentials: never from outside the job's own roots, as from team
    b's folder named by a job of team a that no admission checked (one stored before the rule)."""
    folder = tmp_path / "east" / ("b" if case == "another team's" else "a") / "mine"
    fleet = Fleet(
        nodes=(
            Node(name="east-1", site="east", cluster="c", domain="d", gpu_type="a100", gpus=4),
            Node(name="west-1", site="west", cluster="c", domain="d", gpu_type="a100", gpus=4),
        ),
        sites=(
            Site(name="east", checkpoint_store=(tmp_path / "east").as_uri()),
            Site(name="west", checkpoint_store=(tmp_path / "west").as_uri()),
        ),
    )
    clock, launcher = Clock(), RecordingLauncher()
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=4, gpu_quota=8), clock())
    service = SchedulerService(engine, launcher, fleet, api_url=lambda: "http://api", clock=clock)
    job_id = submit(engine, clock, spec(gpus=4, checkpoint={"url": folder.as_uri()}))
    east = Placement("east", "c", "d", (NodeSlice("east-1", (0, 1, 2, 3)),))
    (first,) = reserve_batch(engine, [Reservation(job_id, east, False)], at=clock(), lease_ttl_s=60)
    assert first is not None
    step_url = write_checkpoint(folder / "step-000000120", 120, corrupt=case == "corrupt")
    report_checkpoint(engine, first, step_url, 120, clock())
    blocker = submit(engine, clock, spec(name="blocker", gpus=4))
    # east is busy with another job when ours is lost: the scheduler can only place it in the west
    with engine.begin() as conn:
        attempt_store.finish(conn, first.id, AttemptState.LOST, at=clock(), reason="node lost")
    (blocker_attempt,) = reserve_batch(
        engine, [Reservation(blocker, east, False)], at=clock(), lease_ttl_s=600
    )
    assert blocker_attempt is not None
    service.step()
    detail = job_store.detail(engine, job_id)
    assert detail is not None
    second = detail.attempts[-1]
    assert second.placement["site"] == "west"
    if case != "intact":
        assert second.state.value == "FAILED" and "checkpoint transfer failed" in (second.reason or "")
        assert second.id not in launcher.launched
        if case == "another team's":
            assert "lies outside job" in (second.reason or "") and not (tmp_path / "west").exists()
        assert detail.job.failures == 1  # counted, with backoff: a corrupt checkpoint stays corrupt
        return
    request = launcher.launched[second.id]
    west_root = (tmp_path / "west" / "a" / job_id).as_uri()
    assert request.checkpoint_url == west_root
    copied = tmp_path / "west" / "a" / job_id / "step-000000120" / "state" / "__0_0.distcp"
    assert copied.read_bytes() == (folder / "step-000000120" / "state" / "__0_0.distcp").read_bytes()
    moved = [e for e in detail.events if e.type == "job.checkpoint_moved"]
    assert len(moved) == 1 and moved[0].data["files"] == 4 and moved[0].data["site"] == "west"
    assert detail.job.checkpoint_site == "west" and detail.job.checkpoint_url.startswith(west_root)
