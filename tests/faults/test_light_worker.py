"""The fault suite's light worker (worker.py) keeps what the checker relies on: a durable checkpoint
stays durable."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """worker.py as a module, its journal to a socket nobody reads (its records are dropped)."""
    for name, value in {
        "GPUYARD_ATTEMPT_ID": "a1",
        "GPUYARD_JOB_ID": "j1",
        "GPUYARD_FENCING_TOKEN": "7",
        "FAULTS_JOURNAL": str(tmp_path / "nobody.sock"),
        "FAULTS_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("worker", None)
    return importlib.import_module("worker")


@pytest.mark.timeout(10)  # without the rule, the second save waits on the hold for ever
def test_a_stop_right_after_a_save_never_writes_over_the_durable_checkpoint(
    worker: ModuleType, tmp_path: Path
) -> None:
    """Seed 704: a preemption answered the beat that reported step 5; the stop saved step 5 again, in
    place, the suite killed it half way (kill-mid-checkpoint) and the store's recorded checkpoint was
    torn. A second save of a step it completed returns it as it is (here it would wait on the hold)."""
    root, hold = tmp_path / "checkpoints", tmp_path / "hold"
    url = worker.save(root, 5, hold)
    hold.touch()  # a save that writes anything now would wait here until killed
    assert worker.save(root, 5, hold) == url
    assert worker.complete(worker.step_dir(root, 5)) == 5


def test_a_step_an_earlier_attempt_completed_is_saved_again_and_journaled(
    worker: ModuleType, tmp_path: Path
) -> None:
    """Seed 706: the checker asks each attempt that reports a checkpoint to have completed it; one an
    earlier attempt of the job left complete is written again by the new attempt, not taken as its."""
    root, hold = tmp_path / "checkpoints", tmp_path / "hold"
    worker.save(root, 6, hold)
    worker._saved.clear()  # a new attempt: another process
    written = []
    worker.journal = lambda event, **data: written.append(event)
    worker.save(root, 6, hold)
    assert written == ["committing", "saved"]


def test_a_zombies_late_save_lands_in_a_folder_of_its_own_token(
    worker: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 1112 on the emulated cluster: a worker stuck 50 s in an upload (its lease lapsed, its node
    NotReady) completed step 10 after its successor had saved step 10 to the same folder. Each
    attempt writes only folders named with its own token, as the runtime does: no attempt's save
    touches another's."""
    root, hold = tmp_path / "checkpoints", tmp_path / "hold"
    successor = worker.save(root, 10, hold)
    before = (worker.step_dir(root, 10) / worker.MANIFEST).stat().st_mtime_ns
    worker._saved.clear()
    monkeypatch.setenv("GPUYARD_FENCING_TOKEN", "6")  # the zombie: an older attempt's token
    zombie = worker.save(root, 10, hold)
    assert zombie != successor and zombie.endswith("step-000010-t6") and successor.endswith("step-000010-t7")
    monkeypatch.setenv("GPUYARD_FENCING_TOKEN", "7")
    assert (worker.step_dir(root, 10) / worker.MANIFEST).stat().st_mtime_ns == before
