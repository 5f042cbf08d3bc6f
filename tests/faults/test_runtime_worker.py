"""The suite's real-runtime worker (`runtime_worker.py`): the training runtime on the campaign's tiny
model tells the journal what it did, and obeys the suite's hold and slow-disk files.

One attempt is held half way through its first checkpoint (the hold file exists before it starts, so
the hold is certain, not timed) and killed there; the next resumes from nothing (that folder has no
manifest) and finishes, its fsyncs slowed, its every save journaled after its manifest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from heartbeat_plane import ControlPlane, lease

from training import exit_codes
from training.checkpoint import CheckpointStore

from .history import JournalCollector
from .workload import RUNTIME_WORKER, write_runtime_config


def start(run: Path, attempt: str, steps: int, plane: ControlPlane | None = None) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "RANK", "WORLD_SIZE"))},
        "GPUYARD_ATTEMPT_ID": attempt,
        "GPUYARD_JOB_ID": "job-1",
        "GPUYARD_CHECKPOINT_URL": (run / "checkpoints").as_uri(),
        "FAULTS_JOURNAL": str(run / "journal.sock"),
        "FAULTS_DIR": str(run),
    }
    if plane is not None:
        env |= plane.env(job_id="job-1") | {"GPUYARD_ATTEMPT_ID": attempt}
    command = [sys.executable, str(RUNTIME_WORKER), "--config", str(run / "runtime.yaml")]
    command += ["--set", f"train.max_steps={steps}"]
    log = (run / f"{attempt}.log").open("wb")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_the_real_runtime_journals_its_resume_saves_and_exit_and_obeys_hold_and_slow_disk(
    tmp_path: Path,
) -> None:
    write_runtime_config(tmp_path)
    journal = JournalCollector(tmp_path / "journal.sock", tmp_path / "journal.jsonl")
    try:
        (tmp_path / "hold").mkdir()
        (tmp_path / "hold" / "a1").touch()
        first = start(tmp_path, "a1", steps=12)
        half = journal.wait_for(lambda r: r.attempt == "a1" and r.e == "half_written", 90)
        assert half is not None, (tmp_path / "a1.log").read_text()
        assert half.data["step"] == 5
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        (tmp_path / "hold" / "a1").unlink()

        (tmp_path / "slow-fsync").write_text("0.01")
        with ControlPlane(lambda n, body: lease("continue"), attempt_id="a2") as plane:
            second = start(tmp_path, "a2", steps=12, plane=plane)
            assert second.wait(timeout=120) == exit_codes.SUCCESS, (tmp_path / "a2.log").read_text()
        assert journal.wait_for(lambda r: r.attempt == "a2" and r.e == "exit", 5) is not None
    finally:
        journal.close()
    by = {a: [r for r in journal.records if r.attempt == a] for a in ("a1", "a2")}
    assert [r.e for r in by["a1"]][:2] == ["start", "resume"]
    assert "saved" not in [r.e for r in by["a1"]]
    events = [r.e for r in by["a2"]]
    assert events[:2] == ["start", "resume"] and events[-1] == "exit"
    resume = by["a2"][1]
    assert resume.data["step"] == 0, "the held step-5 folder has no manifest: nothing to resume from"
    assert [r.data["step"] for r in by["a2"] if r.e == "saved"] == [5, 10, 12]
    assert [r.data["step"] for r in by["a2"] if r.e == "step"] == list(range(1, 13))
    assert by["a2"][-1].data["code"] == exit_codes.SUCCESS
    assert "slow_fsync" in events, "the slow disk was never felt"
    # Every beat the runtime sent reached the plane, was answered and journaled; the last one carries
    # the final step and checkpoint.
    beats = [r for r in by["a2"] if r.e == "beat"]
    assert "beat_failed" not in events and len(beats) == len(plane.beats) >= 2
    assert plane.beats[-1]["step"] == 12 and plane.beats[-1]["checkpoint"]["step"] == 12
    # Each `saved` names a complete checkpoint (manifest last, files matching it).
    store = CheckpointStore((tmp_path / "checkpoints").as_uri())
    # keep_last 2, and the one the control plane had recorded when the last save pruned (a beat that
    # carried 10 may be answered after the save of 12, under load).
    kept = [m.step for m in store.complete()]
    reported = {beat["checkpoint"]["step"] for beat in plane.beats if beat["checkpoint"]}
    assert kept[-2:] == [10, 12] and set(kept[:-2]) <= reported - {10, 12}, (kept, reported)
