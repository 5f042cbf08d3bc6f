"""Checkpoint store: completeness, integrity, retention; and a save/restore round trip in one process."""

from __future__ import annotations

import copy
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from training import checkpoint, distributed
from training.checkpoint import MANIFEST, Checkpointer, CheckpointError, CheckpointStore, read_model_state
from training.model import MLPClassifier


def fake_checkpoint(
    store: CheckpointStore, step: int, metrics: dict[str, float] | None = None, complete: bool = True
) -> None:
    base = Path(store.step_path(step))
    (base / "state").mkdir(parents=True)
    (base / "state" / "__0_0.distcp").write_bytes(bytes([step % 256]) * 100)
    (base / "trainer.pt").write_bytes(b"x")
    if complete:
        store.finalize(step, 1, metrics or {}, {"mlflow_run_id": "r"}, 0.1)


def test_only_checkpoints_with_a_manifest_count(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path.as_uri())
    fake_checkpoint(store, 10)
    fake_checkpoint(store, 20, complete=False)  # a writer died before the manifest
    assert store.steps() == [10, 20]
    latest = store.latest()
    assert latest is not None and latest.step == 10
    assert set(latest.files) == {"state/__0_0.distcp", "trainer.pt"}
    assert latest.bytes == 101  # what a heartbeat reports of it, and a move to another site copies
    assert not (tmp_path / f"step-{10:09d}" / f"{MANIFEST}.tmp").exists()


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path.as_uri())
    fake_checkpoint(store, 10)
    fake_checkpoint(store, 20)
    data = tmp_path / f"step-{20:09d}" / "state" / "__0_0.distcp"
    data.write_bytes(b"\x00" * 100)  # same size, different bytes: only the checksum sees it
    assert store.verify(store.read_manifest(20), checksums=False) is None  # type: ignore[arg-type]
    latest = store.latest(verify_checksums=True)
    assert latest is not None and latest.step == 10
    data.unlink()
    assert "missing" in (store.verify(store.read_manifest(20)) or "")  # type: ignore[arg-type]


def test_retention_keeps_newest_and_best_and_drops_abandoned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path.as_uri())
    losses = {10: 0.9, 20: 0.3, 30: 0.5, 40: 0.6, 50: 0.7}
    for step, loss in losses.items():
        fake_checkpoint(store, step, {"val_loss": loss})
    fake_checkpoint(store, 45, complete=False)
    deleted = store.apply_retention(keep_last=2, best_metric="val_loss", best_mode="min", newest=50)
    assert sorted(deleted) == [10, 30, 45]
    assert store.steps() == [20, 40, 50]
    assert [m.step for m in store.complete()] == [20, 40, 50]


def test_a_zombie_writer_can_neither_mix_into_nor_delete_its_successors_steps(tmp_path: Path) -> None:
    """The review's zombie: an attempt whose lease passed kept checkpointing, and its retention deleted
    its successor's newer, incomplete steps. Folders are fenced by the writer's token now."""
    zombie, successor = (
        CheckpointStore(tmp_path.as_uri(), token=5),
        CheckpointStore(tmp_path.as_uri(), token=6),
    )
    fake_checkpoint(zombie, 300)
    fake_checkpoint(successor, 400, complete=False)  # resumed from 300, now writing 400
    fake_checkpoint(zombie, 400, complete=False)  # the same step, written side by side
    zombie.clear_incomplete(400)  # what the zombie's next save of step 400 starts with
    fake_checkpoint(zombie, 400)
    fake_checkpoint(zombie, 500)
    zombie.apply_retention(keep_last=1, best_metric=None, best_mode="min", newest=500)
    assert (6 and Path(successor.step_path(400)).exists()) and not (
        Path(successor.step_path(400)) / MANIFEST
    ).exists()
    fake_checkpoint_files = sorted(p.name for p in (Path(successor.step_path(400)) / "state").iterdir())
    assert fake_checkpoint_files == ["__0_0.distcp"]  # its own files only, none of the zombie's
    successor.finalize(400, 1, {}, {}, 0.1)
    successor.apply_retention(keep_last=1, best_metric=None, best_mode="min", newest=400)
    # the successor may clean up what older writers left (here the oldest, beyond keep_last)
    assert successor.entries() == [(400, 6), (500, 5)]
    latest = successor.latest()
    assert latest is not None and (latest.step, latest.writer_token) == (500, 5)


def test_a_retry_resumes_from_the_checkpoint_the_control_plane_recorded(tmp_path: Path) -> None:
    """A zombie's step 500 is complete on disk, but the store recorded the successor's 400 (a zombie's
    heartbeat is refused): the next attempt resumes from 400, and from the newest only without a record."""
    zombie, successor = (
        CheckpointStore(tmp_path.as_uri(), token=5),
        CheckpointStore(tmp_path.as_uri(), token=6),
    )
    fake_checkpoint(successor, 400)
    fake_checkpoint(zombie, 500)
    retry = CheckpointStore(tmp_path.as_uri(), token=7)
    recorded = retry.recorded(successor.step_url(400))
    assert recorded is not None and (recorded.step, recorded.writer_token) == (400, 6)
    assert retry.recorded(tmp_path.parent.as_uri() + "/elsewhere/step-000000400-t6") is None  # not this root
    assert retry.recorded(retry.step_url(450)) is None  # no such checkpoint: fall back to the newest
    newest = retry.latest()
    assert newest is not None and newest.step == 500


def test_manifest_records_run_identity(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path.as_uri())
    fake_checkpoint(store, 5)
    raw = json.loads((tmp_path / f"step-{5:09d}" / MANIFEST).read_text())
    assert raw["run"] == {"mlflow_run_id": "r"} and raw["format_version"] == checkpoint.FORMAT_VERSION
    assert len(raw["files"]["trainer.pt"]["sha256"]) == 64


@pytest.fixture(scope="module")
def world() -> Iterator[distributed.World]:
    w = distributed.init("gloo", env={})
    yield w
    distributed.shutdown()


def train_a_bit(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(
    ("async_save", "scheme"), [(False, "file"), (True, "file"), (True, "memory"), (True, "s3")]
)
def test_save_and_restore_round_trip(
    tmp_path: Path, world: distributed.World, async_save: bool, scheme: str, request: pytest.FixtureRequest
) -> None:
    """Any fsspec URL: a local folder, an in-memory filesystem, an S3 bucket over HTTP (moto's server)."""
    torch.manual_seed(0)
    model = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train_a_bit(model, opt, 3)
    url = {
        "file": lambda: tmp_path.as_uri(),
        "memory": lambda: f"memory://ckpt-{tmp_path.name}",
        "s3": lambda: request.getfixturevalue("s3_bucket") + "/team-a/job-1",
    }[scheme]()
    store = CheckpointStore(url)
    ckpt = Checkpointer(store, 0, 1, world.checkpoint_group, async_save=async_save)
    torch.manual_seed(1234)
    ckpt.save(
        3, model, opt, {"scheduler": {}, "samples_seen": 24}, {"val_loss": 0.5}, {"mlflow_run_id": "abc"}
    )
    expected_rand = torch.rand(3)
    saved = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict()["state"])
    train_a_bit(model, opt, 2)  # mutates the live tensors while an async save may still be writing
    ckpt.close()
    assert ckpt.latest is not None and ckpt.latest.step == 3
    on_disk = read_model_state(store.step_url(3))
    for name, value in saved.items():
        assert torch.equal(on_disk[name], value), name

    torch.manual_seed(99)
    fresh = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    loader = Checkpointer(store, 0, 1, world.checkpoint_group)
    manifest = loader.find_latest()
    assert manifest is not None and manifest.run["mlflow_run_id"] == "abc"
    restored = loader.restore(manifest, fresh, fresh_opt)
    assert restored.rng_restored and restored.trainer["samples_seen"] == 24
    assert torch.equal(torch.rand(3), expected_rand)  # the RNG continues where it was saved
    for name, value in saved.items():
        assert torch.equal(fresh.module.state_dict()[name], value), name
    restored_opt = fresh_opt.state_dict()["state"]
    assert restored_opt.keys() == saved_opt.keys()
    for index, state in saved_opt.items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(restored_opt[index][key], state[key]), (index, key)


def test_a_checkpoint_of_format_1_still_resumes_its_optimizer(
    tmp_path: Path, world: distributed.World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Format 1 nested the optimizer's state by parameter group; a job checkpointed before format 2 (by
    parameter name) resumes after the upgrade with its optimizer's state."""
    torch.manual_seed(0)
    model = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train_a_bit(model, opt, 3)
    store = CheckpointStore(tmp_path.as_uri())
    with monkeypatch.context() as old:
        old.setattr(checkpoint, "FORMAT_VERSION", 1)
        Checkpointer(store, 0, 1, world.checkpoint_group).save(3, model, opt, {}, {}, {})
    manifest_path = Path(store.step_path(3)) / MANIFEST
    manifest_path.write_text(json.dumps(json.loads(manifest_path.read_text()) | {"format_version": 1}))
    fresh = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    loader = Checkpointer(store, 0, 1, world.checkpoint_group)
    manifest = loader.find_latest()
    assert manifest is not None and manifest.format_version == 1
    loader.restore(manifest, fresh, fresh_opt)
    saved, restored = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert restored.keys() == saved.keys()
    for index, state in saved.items():
        assert torch.equal(restored[index]["exp_avg"], state["exp_avg"]), index
    manifest_path.write_text(manifest_path.read_text().replace('"format_version": 1', '"format_version": 9'))
    with pytest.raises(CheckpointError, match="format_version: expected one of"):
        CheckpointStore(tmp_path.as_uri()).read_manifest(3)


def test_retention_keeps_the_checkpoint_the_control_plane_recorded_until_it_records_a_newer_one(
    tmp_path: Path, world: distributed.World
) -> None:
    """Reports of newer saves were lost (a partition): a retry resumes from the recorded checkpoint, so
    retention must not delete it (the fault campaign's seed 500: keep_last took it, the retry found it
    gone and resumed from a checkpoint the control plane never committed)."""
    model = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    store = CheckpointStore(tmp_path.as_uri(), token=7)
    first = Checkpointer(store, 0, 1, world.checkpoint_group, keep_last=1)
    resumed_from = first.store.step_url(5)
    first.save(5, model, opt, {"scheduler": {}}, {}, {})
    first.recorded_by_control_plane(resumed_from)  # a beat carrying step 5 was answered
    for step in (10, 15):  # their beats never reached the control plane
        first.save(step, model, opt, {"scheduler": {}}, {}, {})
    first.close()
    assert [m.step for m in store.complete()] == [5, 15]  # keep_last 1, and the recorded one

    retry = Checkpointer(
        CheckpointStore(tmp_path.as_uri(), token=8), 0, 1, world.checkpoint_group, keep_last=1
    )
    manifest = retry.find_latest(recorded=resumed_from)
    assert manifest is not None and manifest.step == 5  # the committed one, not the newer unreported 15
    retry.save(20, model, opt, {"scheduler": {}}, {}, {})
    assert [m.step for m in retry.store.complete()] == [5, 20]  # still the job's recorded checkpoint
    retry.recorded_by_control_plane(retry.store.step_url(20))
    retry.save(25, model, opt, {"scheduler": {}}, {}, {})
    retry.close()
    assert [m.step for m in retry.store.complete()] == [20, 25]


def test_abandoned_checkpointer_writes_no_manifest(tmp_path: Path, world: distributed.World) -> None:
    model = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    opt = torch.optim.AdamW(model.parameters())
    store = CheckpointStore(tmp_path.as_uri())
    ckpt = Checkpointer(store, 0, 1, world.checkpoint_group, async_save=True)
    ckpt.save(1, model, opt, {}, {}, {})
    ckpt.wait()
    ckpt.abandon()
    ckpt.save(2, model, opt, {}, {}, {})
    ckpt.close()
    assert store.steps() == [1, 2]  # the data of step 2 was written...
    latest = store.latest()
    assert latest is not None and latest.step == 1  # ...but it is not a checkpoint anyone will read
    assert ckpt.latest is not None and ckpt.latest.step == 1


def test_leftovers_of_an_interrupted_attempt_are_cleared_before_saving(
    tmp_path: Path, world: distributed.World
) -> None:
    store = CheckpointStore(tmp_path.as_uri())
    stale = tmp_path / f"step-{4:09d}" / "state" / "__1_0.distcp"  # from a 2-worker attempt that died
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    model = distributed.wrap(MLPClassifier(4, (8,)), "ddp", world)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = Checkpointer(store, 0, 1, world.checkpoint_group)
    ckpt.save(4, model, opt, {}, {}, {})
    manifest = store.latest()
    assert manifest is not None and manifest.step == 4
    assert "state/__1_0.distcp" not in manifest.files and not stale.exists()
    with pytest.raises(CheckpointError, match="already complete"):
        ckpt.save(4, model, opt, {}, {}, {})
    ckpt.close()


def test_an_object_store_that_never_answers_fails_the_request_within_the_io_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A black hole (a server that accepts connections and never answers, as a connection a network
    fault dropped behaves): each request gives up after `io_timeout_s`, not botocore's 60 s per try."""
    import fsspec

    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)  # the kernel completes the handshakes; nobody ever reads or answers
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{hole.getsockname()[1]}")
        for name, value in {
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_MAX_ATTEMPTS": "1",
        }.items():
            monkeypatch.setenv(name, value)
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        store = CheckpointStore("s3://nowhere/team-a/job-1", io_timeout_s=0.5)
        began = time.monotonic()
        with pytest.raises(OSError):  # s3fs's own retries included
            store.entries()
        assert time.monotonic() - began < 30, "a request waited past its timeout"
    fsspec.get_filesystem_class("s3").clear_instance_cache()
