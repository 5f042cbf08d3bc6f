"""Sites: a job placed away from its newest checkpoint waits for a verified copy, made outside the
scheduling passes by the leader's mover (scheduler/mover.py), before its GPUs are reserved there."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from gpuyard.checkpoint_transfer import Copied, Landed, TransferError, copy_checkpoint
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node, Site
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.sites import Wan
from gpuyard.domain.states import AttemptState
from gpuyard.scheduler.mover import CopyRules
from gpuyard.scheduler.service import RESUME_URL, SchedulerService
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import leadership
from gpuyard.store import teams as team_store
from gpuyard.store import transfers as transfer_store
from gpuyard.store import waits as wait_store
from gpuyard.store.leadership import NotLeading
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.tables import attempts, events, leases
from gpuyard.store.transfers import CheckpointTransfer, TransferState
from servers import S3Server, free_port
from sqlalchemy import Engine, func, select
from stores import report_checkpoint

from .test_leadership import lapse
from .test_scheduler_service import Clock, RecordingLauncher, spec, submit

pg = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
EAST = Placement("east", "c", "d", (NodeSlice("east-1", (0, 1, 2, 3)),))
FILES = {"state/__0_0.distcp": b"\x00weights" * 1000, "rng/rank-0.pt": b"rng", "trainer.pt": b"trainer"}
FIRST = "rng/rank-0.pt"  # the first file a copy lands (sorted, the manifest last)


def write_checkpoint(directory: Path, step: int, *, corrupt: bool = False) -> str:
    """A checkpoint in the training runtime's layout: data files, then a manifest with checksums."""
    entries = {}
    for name, data in FILES.items():
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
    copied = copy_checkpoint(source, (tmp_path / "west" / "step-000000120").as_uri())
    assert copied.files == 4 and copied.bytes > 8000 and copied.copied_bytes == copied.bytes
    for name in (*FILES, "manifest.json"):
        assert (tmp_path / "west" / "step-000000120" / name).read_bytes() == (
            tmp_path / "east" / "step-000000120" / name
        ).read_bytes()
    assert not list((tmp_path / "west").rglob("*.part-*"))  # each part file moved into place
    bad = write_checkpoint(tmp_path / "east" / "step-000000130", 130, corrupt=True)
    with pytest.raises(TransferError, match="does not match the manifest"):
        copy_checkpoint(bad, (tmp_path / "west" / "step-000000130").as_uri())
    assert not [p for p in (tmp_path / "west" / "step-000000130").rglob("*") if p.is_file()]  # no file
    with pytest.raises(TransferError, match="does not exist"):
        copy_checkpoint((tmp_path / "nowhere").as_uri(), (tmp_path / "x").as_uri())
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(TransferError, match=r"copying .* to .*a-file/step"):
        copy_checkpoint(source, (tmp_path / "a-file" / "step").as_uri())


def test_a_checkpoint_travels_to_an_object_store_and_back(tmp_path: Path, s3_bucket: str) -> None:
    """Between sites whose stores are S3 buckets (moto's server over HTTP), verified both ways; a copy
    resumed after its landed files sends only the rest."""
    source = write_checkpoint(tmp_path / "east" / "step-000000120", 120)
    landed: list[Landed] = []
    there = copy_checkpoint(source, f"{s3_bucket}/a/job-1/step-000000120", on_file=landed.append)
    assert there.files == 4 and [f.name for f in landed] == [*sorted(FILES), "manifest.json"]
    assert landed[-1].bytes_done == landed[-1].bytes_total == there.bytes
    back = copy_checkpoint(f"{s3_bucket}/a/job-1/step-000000120", (tmp_path / "west" / "step").as_uri())
    assert back.files == 4 and back.bytes == there.bytes and back.sha256 == there.sha256
    for name in (*FILES, "manifest.json"):
        assert (tmp_path / "west" / "step" / name).read_bytes() == (
            tmp_path / "east" / "step-000000120" / name
        ).read_bytes()
    first = {landed[0].name: landed[0].sha256}
    again = copy_checkpoint(source, f"{s3_bucket}/a/job-1/step-000000120", landed=first)
    assert again.copied_bytes == there.bytes - len(FILES[FIRST]) and again.sha256 == there.sha256
    with pytest.raises(TransferError, match="does not exist"):
        copy_checkpoint(f"{s3_bucket}/a/job-1/step-000000999", (tmp_path / "x").as_uri())


def test_each_end_of_a_copy_is_opened_with_its_own_stores_options(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sites, two S3 endpoints: the copy reads the source's with its options and writes the
    destination's with its own, where the environment reaches neither."""
    for name, value in {**s3_server.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}.items():
        monkeypatch.setenv(name, value)  # the environment's endpoint: nothing listens there
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    west_server = S3Server().start()
    try:
        east, west = (
            server.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}") for server in (s3_server, west_server)
        )
        east_options, west_options = (store_options(server) for server in (s3_server, west_server))
        local = write_checkpoint(tmp_path / "step-000000120", 120)
        step = "a/job-1/step-000000120"
        copy_checkpoint(local, f"{east}/{step}", destination_options=east_options)
        copied = copy_checkpoint(
            f"{east}/{step}", f"{west}/{step}", source_options=east_options, destination_options=west_options
        )
        assert copied.files == 4 and copied.copied_bytes == copied.bytes
        there = fsspec.filesystem("s3", **west_options)
        assert (
            there.cat(f"{west}/{step}/manifest.json")
            == (tmp_path / "step-000000120/manifest.json").read_bytes()
        )
        assert not fsspec.filesystem("s3", **east_options).exists(west)  # the bucket is the other endpoint's
    finally:
        west_server.stop()


def test_an_unreachable_store_fails_the_copy_as_a_transfer_error(tmp_path: Path, s3_server: S3Server) -> None:
    """The S3 client raises its own errors for an endpoint nothing answers at (not OSError): the
    copy names it as a TransferError, which the mover retries, rather than a crash of its thread."""
    local = write_checkpoint(tmp_path / "step-000000120", 120)
    nowhere: dict[str, object] = {
        **store_options(s3_server),
        "endpoint_url": f"http://127.0.0.1:{free_port()}",
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},  # fail at once
    }
    with pytest.raises(TransferError, match="Could not connect"):
        copy_checkpoint(local, "s3://ckpt-nowhere/a/job-1/step-000000120", destination_options=nowhere)


def store_options(server: S3Server) -> dict[str, str]:
    """A site's `checkpoint_store_options` for the S3 endpoint `server`."""
    credentials = server.CREDENTIALS
    return {
        "endpoint_url": server.url,
        "key": credentials["AWS_ACCESS_KEY_ID"],
        "secret": credentials["AWS_SECRET_ACCESS_KEY"],
    }


# -- moves under the scheduler -----------------------------------------------------------------------


class PausedCopy:
    """The real copy, held once its first file has landed (and the mover recorded it) until the test
    lets it go: a barrier, where a copy longer than a lead's lease or a pass would be."""

    def __init__(self) -> None:
        self.held, self.go = threading.Event(), threading.Event()

    def __call__(self, *args: Any, on_file: Callable[[Landed], None], **kwargs: Any) -> Copied:
        def hold(file: Landed) -> None:
            on_file(file)
            if not self.held.is_set():
                self.held.set()
                assert self.go.wait(30), "the test never let the copy go"

        return copy_checkpoint(*args, on_file=hold, **kwargs)


@dataclass
class Move:
    """Job `job_id` (team a, 4 GPUs) checkpointed at east and was lost there, east is full (`blocker`
    holds it), west is empty: the scheduler may move it."""

    engine: Engine
    clock: Clock
    root: Path
    job_id: str
    blocker: str  # the attempt holding east
    step_dir: Path  # its checkpoint at east

    def service(
        self, holder: str = "one", wan: Wan | None = Wan(10.0, 0.0, 0.02), **rules: Any
    ) -> SchedulerService:
        return SchedulerService(
            self.engine,
            RecordingLauncher(),
            fleet(self.root),
            api_url=lambda: "http://api",
            clock=self.clock,
            holder=holder,
            lease_ttl_s=20,
            wan=wan,
            copy_rules=CopyRules(**{"deadline_floor_s": 60.0, "backoff_s": 0.0, **rules}),
        )

    def west(self) -> Path:
        return self.root / "west" / "a" / self.job_id / self.step_dir.name

    def transfer(self) -> CheckpointTransfer:
        with self.engine.connect() as conn:
            found = transfer_store.get(conn, self.job_id)
        assert found is not None
        return found

    def events(self, kind: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(events.c.data)
                .where(events.c.job_id == self.job_id, events.c.type == kind)
                .order_by(events.c.seq)
            )
            return [row.data for row in rows]

    def attempts_at(self, site: str) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(attempts.c.id, attempts.c.placement).where(attempts.c.job_id == self.job_id)
            )
            return [row.id for row in rows if row.placement["site"] == site]

    def free_east(self) -> None:
        with self.engine.begin() as conn:
            attempt_store.finish(conn, self.blocker, AttemptState.SUCCEEDED, at=self.clock(), reason="done")


def fleet(root: Path) -> Fleet:
    return Fleet(
        nodes=(
            Node(name="east-1", site="east", cluster="c", domain="d", gpu_type="a100", gpus=4),
            Node(name="west-1", site="west", cluster="c", domain="d", gpu_type="a100", gpus=4),
        ),
        sites=(
            Site(name="east", checkpoint_store=(root / "east").as_uri()),
            Site(name="west", checkpoint_store=(root / "west").as_uri()),
        ),
    )


def lost_at_east(
    engine: Engine, root: Path, *, folder: str = "a/mine", nbytes: int | None = None, corrupt: bool = False
) -> Move:
    clock = Clock()
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=4, gpu_quota=8), clock())
    job_id = submit(engine, clock, spec(gpus=4, checkpoint={"url": (root / "east" / folder).as_uri()}))
    (first,) = reserve_batch(engine, [Reservation(job_id, EAST, False)], at=clock(), lease_ttl_s=60)
    assert first is not None
    step_dir = root / "east" / folder / "step-000000120"
    url = write_checkpoint(step_dir, 120, corrupt=corrupt)
    report_checkpoint(engine, first, url, 120, clock(), nbytes=nbytes)
    blocker_job = submit(engine, clock, spec(name="blocker", gpus=4))
    with engine.begin() as conn:
        attempt_store.finish(conn, first.id, AttemptState.LOST, at=clock(), reason="node lost")
    (blocker,) = reserve_batch(engine, [Reservation(blocker_job, EAST, False)], at=clock(), lease_ttl_s=600)
    assert blocker is not None
    return Move(engine, clock, root, job_id, blocker.id, step_dir)


@pg
def test_a_pass_completes_while_a_copy_is_held_and_the_gpus_are_reserved_once_it_landed(
    engine: Engine, tmp_path: Path
) -> None:
    move = lost_at_east(engine, tmp_path)
    service = move.service()
    service.mover.copy = paused = PausedCopy()
    assert service.hold_lead()
    service.step()  # east is full; the move pays at once (a copy of ~8 KB): a transfer starts
    assert paused.held.wait(30)
    service.step()  # the copy is held: this pass completes all the same
    held = move.transfer()
    assert held.state == TransferState.COPYING and held.site == "west"
    assert list(held.files) == [FIRST] and held.bytes_done == len(FILES[FIRST])
    assert (
        held.bytes_total == sum(map(len, FILES.values())) + (move.step_dir / "manifest.json").stat().st_size
    )
    assert move.attempts_at("west") == []  # nothing reserved while it copies
    with engine.connect() as conn:
        assert (
            conn.execute(select(func.count()).select_from(leases).where(leases.c.node == "west-1")).scalar()
            == 0
        )
    (progress,) = move.events("job.transfer_progress")
    assert progress == {
        "site": "west",
        "file": FIRST,
        "bytes_done": held.bytes_done,
        "bytes_total": held.bytes_total,
    }
    with engine.connect() as conn:
        waiting = wait_store.read(conn)[move.job_id].reason
    assert waiting.code == "copying" and waiting.text.startswith(
        f"copying its checkpoint to site west: {held.bytes_done} of {held.bytes_total} bytes landed"
    )
    paused.go.set()
    service.mover.close(timeout_s=30)
    assert move.transfer().state == TransferState.LANDED
    service.step()
    (attempt_id,) = move.attempts_at("west")
    request = service.launcher.launched[attempt_id]
    assert request.checkpoint_url == (tmp_path / "west" / "a" / move.job_id).as_uri()
    assert request.env[RESUME_URL] == move.west().as_uri()
    for name in FILES:
        assert (move.west() / name).read_bytes() == (move.step_dir / name).read_bytes()
    (moved,) = move.events("job.checkpoint_moved")
    assert moved["files"] == 4 and moved["site"] == "west" and moved["sent_bytes"] == held.bytes_total
    detail = job_store.detail(engine, move.job_id)
    assert detail is not None and detail.job.checkpoint_site == "west"


@pg
def test_a_copy_interrupted_by_a_leader_change_resumes_under_the_new_leader_without_copying_again(
    engine: Engine, tmp_path: Path
) -> None:
    """Replica one's copy is held after its first file landed (as one longer than its lease would be),
    its lead lapses and two takes it: two adopts the transfer and resumes it from the files recorded
    as landed; the first is not copied again (the same file, not a new one moved into place)."""
    move = lost_at_east(engine, tmp_path)
    one, two = move.service("one"), move.service("two")
    one.mover.copy = paused = PausedCopy()
    assert one.hold_lead()
    one.step()
    assert paused.held.wait(30)
    first = (move.west() / FIRST).stat()
    lapse(engine)  # one's renewals stopped (it is paused): its lead passes on the database's clock
    assert two.hold_lead() and two.lead is not None and two.lead.epoch == 2  # recovers: adopts, resumes
    two.mover.close(timeout_s=30)
    landed = move.transfer()
    assert landed.state == TransferState.LANDED and landed.epoch == 2
    again = (move.west() / FIRST).stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert [e["file"] for e in move.events("job.transfer_progress")] == [*sorted(FILES), "manifest.json"]
    (moved,) = move.events("job.checkpoint_moved")
    assert moved["sent_bytes"] == landed.bytes_total - len(FILES[FIRST])
    two.step()
    (west,) = move.attempts_at("west")
    assert west in two.launcher.launch_calls and west not in one.launcher.launch_calls
    paused.go.set()
    one.mover.close(timeout_s=30)


@pg
def test_a_stale_leaders_transfer_writes_are_fenced(engine: Engine, tmp_path: Path) -> None:
    """Let go after another replica took the lead and adopted its transfer, the old leader's copier
    writes nothing more: its next file's record raises NotLeading, and a write under its epoch, even
    one that confirmed no lead, finds the transfer no longer its own."""
    move = lost_at_east(engine, tmp_path)
    one, two = move.service("one"), move.service("two")
    one.mover.copy = paused = PausedCopy()
    two.mover.copy = blocked = PausedCopy()  # two's copy is held too: the transfer stays under way
    assert one.hold_lead()
    one.step()
    assert paused.held.wait(30)
    lapse(engine)
    assert two.hold_lead()
    assert blocked.held.wait(30)
    before = (move.transfer(), move.events("job.transfer_progress"))
    # two resumed after one's first file, and holds after landing its own first (the second)
    assert before[0].epoch == 2 and list(before[0].files) == sorted(FILES)[:2]
    paused.go.set()  # one copies its next file, and tries to record it
    one.mover.close(timeout_s=30)
    assert (move.transfer(), move.events("job.transfer_progress")) == before
    assert one.lead is not None
    with pytest.raises(NotLeading), leadership.fenced(engine, one.lead, now=move.clock()):
        pass
    with engine.begin() as conn:
        at = move.clock()
        assert not transfer_store.record_file(
            conn, move.job_id, 1, name="x", sha256="0", done=1, total=1, at=at
        )
        assert not transfer_store.land(conn, move.job_id, 1, at=at, details={})
        assert not transfer_store.abandon(conn, move.job_id, 1, at=at, reason="stale")
    assert move.transfer() == before[0]
    blocked.go.set()
    two.mover.close(timeout_s=30)
    assert move.transfer().state == TransferState.LANDED


@pg
def test_a_move_that_does_not_pay_is_refused(engine: Engine, tmp_path: Path) -> None:
    """An 8 GB checkpoint over 1 Gbit/s is a 64 s copy: the job waits at its own site (east, full) until
    it has waited that long, then moves; the copy's deadline is three times the estimate."""
    move = lost_at_east(engine, tmp_path, nbytes=8_000_000_000)
    service = move.service(wan=Wan(1.0, 0.0, 0.02))
    service.mover.copy = paused = PausedCopy()
    assert service.hold_lead()
    move.clock.advance(63)
    service.step()
    with engine.connect() as conn:
        assert transfer_store.get(conn, move.job_id) is None
        assert wait_store.read(conn)[move.job_id].reason.code == "no-room"
    assert move.attempts_at("west") == [] and not paused.held.is_set()
    move.clock.advance(1)
    service.step()
    started = move.transfer()
    assert started.state == TransferState.COPYING and started.estimate_s == pytest.approx(64.0)
    assert (started.deadline_at - started.started_at).total_seconds() == pytest.approx(192.0)
    paused.go.set()
    service.mover.close(timeout_s=30)


@pg
def test_a_copy_past_its_deadline_is_abandoned_and_the_job_placed_at_its_home_site(
    engine: Engine, tmp_path: Path
) -> None:
    move = lost_at_east(engine, tmp_path)
    service = move.service()
    service.mover.copy = paused = PausedCopy()
    assert service.hold_lead()
    service.step()
    assert paused.held.wait(30)
    move.clock.advance(60)  # the deadline's floor (the copy's estimate is nothing)
    move.free_east()
    service.step()  # abandons the transfer; the job's wait counts again: it starts at east
    abandoned = move.transfer()
    assert abandoned.state == TransferState.ABANDONED and "past its deadline" in (abandoned.reason or "")
    (event,) = move.events("job.transfer_abandoned")
    assert event["bytes_done"] == len(FILES[FIRST]) and event["reason"] == abandoned.reason
    assert len(move.attempts_at("east")) == 2 and move.attempts_at("west") == []  # the lost one, and now
    paused.go.set()  # the held copier's next record finds the transfer abandoned: it stops
    service.mover.close(timeout_s=30)
    assert move.transfer() == abandoned and move.events("job.checkpoint_moved") == []
    detail = job_store.detail(engine, move.job_id)
    assert detail is not None and detail.job.checkpoint_site == "east"


@pg
@pytest.mark.parametrize("case", ["corrupt", "another team's"])
def test_a_checkpoint_that_may_not_move_stays_where_it_is(engine: Engine, tmp_path: Path, case: str) -> None:
    """A source that does not match its manifest is not retried; a checkpoint outside the job's own
    roots (team b's folder named by a job of team a that no admission checked, one stored before the
    rule) is never read with the scheduler's credentials. Either way the transfer is abandoned and the
    job stays at its own site, its wait counting again."""
    move = lost_at_east(
        engine, tmp_path, folder="b/mine" if case == "another team's" else "a/mine", corrupt=case == "corrupt"
    )
    service = move.service()
    assert service.hold_lead()
    service.step()
    service.mover.close(timeout_s=30)
    abandoned = move.transfer()
    assert abandoned.state == TransferState.ABANDONED
    if case == "corrupt":
        assert "does not match the manifest" in (abandoned.reason or "")
        assert not list((tmp_path / "west").rglob("*.distcp"))
    else:
        assert "lies outside job" in (abandoned.reason or "") and not (tmp_path / "west").exists()
    assert move.attempts_at("west") == [] and move.events("job.checkpoint_moved") == []
