"""Preemption and the control plane, with real worker processes: SIGTERM, heartbeat answers, stale tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from heartbeat_plane import ControlPlane, lease
from servers import free_port, wait_until
from trainkit import REPO, launch, read_events, write_config

from training import exit_codes
from training.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow


def test_checkpoint_and_stop_answer_stops_every_rank_with_a_reported_checkpoint(
    tmp_path: Path, flights_parquet: Path
) -> None:
    """Under `interval_s: auto` the control plane's interval drives checkpoints; `checkpoint_and_stop`
    makes both ranks save at the same step and exit 75; the last heartbeat reports that checkpoint."""

    def answer(n: int, body: dict[str, object]) -> tuple[int, dict[str, object]]:
        return lease("checkpoint_and_stop" if int(body["step"]) >= 12 else "continue", interval=0.5)

    ckpt_dir = tmp_path / "bucket"
    cfg, work = write_config(
        tmp_path,
        flights_parquet,
        train={"max_steps": 500, "step_sleep_s": 0.1, "micro_batch_size": 8},
        checkpoint={"interval_steps": None, "interval_s": "auto", "auto_fallback_s": 1e6},
        heartbeat={"interval_s": 0.2},
    )
    with ControlPlane(answer) as plane:
        workers = launch(cfg, 2, work, env=plane.env(ckpt_dir.as_uri()))
        assert workers.wait(120) == [exit_codes.PREEMPTED] * 2, workers.output()
    events = read_events(work)
    exit_event = events[-1]
    assert exit_event["event"] == "exit" and exit_event["code"] == exit_codes.PREEMPTED
    checkpoints = [e["step"] for e in events if e["event"] == "checkpoint"]
    assert len(checkpoints) >= 2 and checkpoints[-1] == exit_event["step"] < 500
    # The final heartbeat carries the preemption checkpoint; earlier ones carried progress.
    last = plane.beats[-1]
    assert last["checkpoint"]["step"] == exit_event["step"] and last["step"] == exit_event["step"]
    assert last["checkpoint"]["url"].startswith(ckpt_dir.as_uri())
    assert any(b["metrics"].get("train_loss") for b in plane.beats)
    # What the platform's accounting reads: the checkpoint stalls all told, the preemption's included;
    # no restore, as it started afresh.
    stalls = [b["checkpoint_stall_s"] for b in plane.beats]
    assert stalls == sorted(stalls) and last["checkpoint_stall_s"] > stalls[0] >= 0
    assert not any("restore" in b for b in plane.beats)
    # What an elastic sizing reads: the measured step (the test's sleep is no part of it) at the batch
    # of 2 workers of 16 examples a step each, in micro-batches of 8.
    measured = [b["throughput"] for b in plane.beats if "throughput" in b]
    assert measured and "throughput" in last
    assert all(0 < m["step_s"] < 60 for m in measured)
    assert {(m["local_batch"], m["accum_steps"], m["global_batch"]) for m in measured} == {(8, 2, 32)}
    manifest = CheckpointStore(ckpt_dir.as_uri()).latest()
    assert manifest is not None and manifest.step == exit_event["step"]
    assert manifest.run["job_id"] == "job-1" and manifest.run["attempt_id"] == "att-1"
    assert not (work / "checkpoints").exists()  # GPUYARD_CHECKPOINT_URL wins over the config


def delivered(pid: int, sig: int) -> bool:
    """The kernel no longer holds `sig` pending for `pid` (delivered: handled, or the process died)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:
        return True
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return fields["State"].strip().startswith("Z") or not pending & (1 << (sig - 1))


def test_a_sigterm_once_the_run_has_finished_changes_nothing(tmp_path: Path, flights_parquet: Path) -> None:
    """The fault campaign's seed 500: a preemption's SIGTERM reached a worker that had finished training
    and was sending its final beat (the API away); its default action killed it, and a finished run
    was recorded "killed by signal 15". The final beat is held here until the signal has arrived."""
    final_beat, release = threading.Event(), threading.Event()

    def answer(n: int, body: dict[str, object]) -> tuple[int, dict[str, object]]:
        if body["step"] == 6:  # only the first beat and the final one: the interval is an hour
            final_beat.set()
            release.wait(60)
        return lease("continue")

    cfg, work = write_config(
        tmp_path, flights_parquet, train={"max_steps": 6}, heartbeat={"interval_s": 3600}
    )
    with ControlPlane(answer) as plane:
        workers = launch(cfg, 1, work, env=plane.env((tmp_path / "bucket").as_uri()))
        assert final_beat.wait(120), workers.output()
        workers.signal(signal.SIGTERM)
        (worker,) = workers.procs
        wait_until(lambda: delivered(worker.pid, signal.SIGTERM), what="the SIGTERM delivered")
        release.set()
        assert workers.wait(120) == [exit_codes.SUCCESS], workers.output()
    assert read_events(work)[-1]["code"] == exit_codes.SUCCESS


def test_stale_fencing_token_exits_76_without_writing(tmp_path: Path, flights_parquet: Path) -> None:
    cfg, work = write_config(
        tmp_path,
        flights_parquet,
        parallel={"strategy": "auto"},
        train={"max_steps": 500, "step_sleep_s": 0.05},
        checkpoint={"interval_steps": None},
        heartbeat={"interval_s": 0.2},
    )
    with ControlPlane(lambda n, body: lease()) as plane:
        env = {**plane.env(), "GPUYARD_FENCING_TOKEN": "40"}  # not the attempt's (41): stale
        workers = launch(cfg, 1, work, env=env)
        assert workers.wait(120) == [exit_codes.STALE_FENCING_TOKEN], workers.output()
    assert plane.beats == []  # every beat was refused
    assert CheckpointStore((work / "checkpoints").as_uri()).steps() == []
    events = read_events(work)
    assert events[-1]["code"] == exit_codes.STALE_FENCING_TOKEN
    assert events[0]["strategy"] == "ddp"  # `auto`: the planner found the tiny model fits replicated


@pytest.mark.parametrize("node", ["torchrun", "pod"])
def test_sigterm_through_a_nodes_launcher_checkpoints_and_exits_preempted(
    tmp_path: Path, flights_parquet: Path, node: str
) -> None:
    """A pod eviction: SIGTERM reaches the node's launcher, which forwards it to its workers; they finish
    the step, write a complete checkpoint and exit 75. The node's launcher is torchrun, or the runtime
    itself where the Kubernetes launcher starts one process per pod (NNODES, NPROC_PER_NODE): then the
    pod exits 75 too, where torchrun's agent says 1 for any worker's non-zero exit."""
    cfg, work = write_config(
        tmp_path,
        flights_parquet,
        parallel={"strategy": "fsdp"},
        train={"max_steps": 500, "step_sleep_s": 0.1},
        checkpoint={"interval_steps": None},
    )
    port = str(free_port())
    gang = {
        "NNODES": "1",
        "NODE_RANK": "0",
        "NPROC_PER_NODE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }
    command = {
        "torchrun": [
            "-m",
            "torch.distributed.run",
            *("--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port),
        ],
        "pod": [],
    }[node]
    log = (tmp_path / "torchrun.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *command, "-m", "training.run", "--config", str(cfg)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore",
            **(gang if node == "pod" else {}),
        },
    )
    deadline = time.monotonic() + 90
    while not any(e["event"] == "step" and e["step"] >= 3 for e in read_events(work)):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "torchrun.log").read_text()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=90)
    events = read_events(work)
    exit_event = events[-1]
    assert exit_event["event"] == "exit" and exit_event["code"] == exit_codes.PREEMPTED, events[-3:]
    manifest = CheckpointStore((work / "checkpoints").as_uri()).latest()
    assert manifest is not None and manifest.step == exit_event["step"] and manifest.world_size == 2
    assert {"rng/rank-0.pt", "rng/rank-1.pt", "trainer.pt", "state/.metadata"} <= set(manifest.files)
    text = (tmp_path / "torchrun.log").read_text()
    assert text.count("preempted at step") == 2, text[-3000:]  # both workers, not a kill
    if node == "pod":
        assert proc.returncode == exit_codes.PREEMPTED
