"""The fault suite's training worker: behaves towards the control plane as the training runtime does,
and tells the suite everything it does, so the invariant checker can compare the store with the truth.

    worker.py --steps N --step-seconds S --save-every K [--fail-at STEP --exit-code C]

- Checkpoints are files under a file:// GPUYARD_CHECKPOINT_URL, or objects in an object store
  (s3://, the Kubernetes launcher's: `ObjectStore`), each in a folder named with the step and the
  attempt's fencing token (`step-000010-t57`), as the runtime's: a zombie's late save (its lease
  lapsed while it wrote) lands in a folder no other attempt writes.
- Resumes from GPUYARD_RESUME_URL (the checkpoint the store recorded) when it is complete, else from
  the newest complete checkpoint under GPUYARD_CHECKPOINT_URL; a checkpoint is complete once its
  manifest (written last, after the data is fsynced) names the data's size and sha256.
- Heartbeats with its step every `BEAT_EVERY_S` and right after each save (with the checkpoint);
  409 means a successor owns the job: exit 76 without writing. A beat that fails is tried again
  later; once no beat was answered within the lease, it writes no checkpoint until one is (a
  successor may own the job).
- SIGTERM, or a `checkpoint_and_stop` answer: save, report it, exit 75.
- A checkpoint write that fails (the suite fills the checkpoint store's disk) exits 1, as the
  runtime does on a failed save.
- The suite can hold a save half-written (the file `$FAULTS_DIR/hold/<attempt id>` exists): the
  worker writes half the data, says so, and waits until the file is gone, or it is killed.
- The suite can slow the checkpoint disk (the file `$FAULTS_DIR/slow-fsync` holds seconds): each
  fsync of a save takes that much longer, as on a saturated or throttled volume.

Journal: one JSON datagram per record to the Unix socket $FAULTS_JOURNAL (never a file: a full
disk must not silence it), with `time.monotonic()` (the whole machine's clock, never skewed).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import http.client
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from training import exit_codes

PAYLOAD_BYTES = 64 * 1024
BEAT_EVERY_S = 1.0
MANIFEST = "manifest.json"
SLOW_FSYNC = "slow-fsync"

env = os.environ
ATTEMPT, JOB, RANK = env["GPUYARD_ATTEMPT_ID"], env["GPUYARD_JOB_ID"], int(env.get("RANK", "0"))
_journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)


def journal(event: str, **data: Any) -> None:
    record = {"e": event, "attempt": ATTEMPT, "job": JOB, "rank": RANK, "pid": os.getpid()}
    record |= {"t": time.monotonic(), **data}
    with contextlib.suppress(OSError):  # the suite is gone: nobody to tell
        _journal.sendto(json.dumps(record).encode(), env["FAULTS_JOURNAL"])


def pause(seconds: float) -> None:
    # select, not time.sleep: under libfaketime (the suite skews clocks) time.sleep fails with EINVAL
    select.select([], [], [], seconds)


def slow_disk() -> None:
    """While the suite slows the checkpoint disk, wait as long as its file says before an fsync."""
    try:
        delay = float((Path(env["FAULTS_DIR"]) / SLOW_FSYNC).read_text() or 0)
    except (OSError, ValueError):
        return
    journal("slow_fsync", seconds=delay)
    pause(delay)


def fsync(descriptor: int) -> None:
    slow_disk()
    os.fsync(descriptor)


def leave(code: int, **data: Any) -> None:
    journal("exit", code=code, **data)
    sys.exit(code)


# -- checkpoints -------------------------------------------------------------------------------------


def step_name(step: int) -> str:
    """A checkpoint's folder: its step, and the fencing token of the attempt that writes it."""
    return f"step-{step:06d}-t{int(env['GPUYARD_FENCING_TOKEN'])}"


def step_dir(root: Path, step: int) -> Path:
    return root / step_name(step)


def payload(step: int) -> bytes:
    return (f"{JOB} step {step}\n".encode() * (PAYLOAD_BYTES // 32 + 1))[:PAYLOAD_BYTES]


def complete(directory: Path) -> int | None:
    """The step of a complete checkpoint directory, else None."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        data = (directory / "state.bin").read_bytes()
    except (OSError, ValueError):
        return None
    if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        return None
    return int(manifest["step"])


def newest_complete(root: Path) -> tuple[int, Path | None]:
    for directory in sorted(root.glob("step-*"), reverse=True):
        if (step := complete(directory)) is not None:
            return step, directory
    return 0, None


def fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        fsync(descriptor)
    finally:
        os.close(descriptor)


_saved: set[int] = set()  # the steps this process completed


def save(root: Path, step: int, hold: Path) -> str:
    directory = step_dir(root, step)
    if step in _saved and complete(directory) == step:
        return directory.as_uri()  # a stop right after its own save: never write over it again
    directory.mkdir(parents=True, exist_ok=True)
    data = payload(step)
    with open(directory / "state.bin", "wb") as out:
        out.write(data[: len(data) // 2])
        out.flush()
        if hold.exists():
            journal("half_written", step=step)
            while hold.exists():  # the suite kills us here
                pause(0.02)
        out.write(data[len(data) // 2 :])
        out.flush()
        fsync(out.fileno())
    manifest = {"step": step, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    partial = directory / f"{MANIFEST}.tmp"
    partial.write_text(json.dumps(manifest))
    with open(partial, "rb+") as handle:
        fsync(handle.fileno())
    journal("committing", step=step)  # from here the checkpoint may be complete before `saved` says so
    os.replace(partial, directory / MANIFEST)
    fsync_dir(directory)
    journal("saved", step=step, url=directory.as_uri())
    _saved.add(step)
    return directory.as_uri()


class ObjectStore:
    """The same checkpoints in an object store (s3://, as production keeps them: the credentials and
    endpoint in the environment): each object appears whole when its upload completes, so a save held
    half-written has uploaded nothing yet; the manifest is uploaded last."""

    def __init__(self, url: str):
        import fsspec  # only here: the light worker's start stays light where checkpoints are files

        # Every wait bounded (botocore's own read timeout is 60 s): an upload that hangs (a black-holed
        # link, a connection the store dropped) fails in seconds and is retried (AWS_MAX_ATTEMPTS).
        bounds = {"connect_timeout": 5, "read_timeout": 10}
        self.fs, self.root = fsspec.core.url_to_fs(url, config_kwargs=bounds)
        self.scheme = url.split("://", 1)[0]

    def url(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def complete(self, url: str) -> int | None:
        path = url.split("://", 1)[1].rstrip("/")
        try:
            manifest = json.loads(self.fs.cat_file(f"{path}/{MANIFEST}"))
            data = self.fs.cat_file(f"{path}/state.bin")
        except (OSError, ValueError):
            return None
        if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            return None
        return int(manifest["step"])

    def newest_complete(self) -> int:
        try:
            found = sorted(self.fs.ls(self.root, detail=False, refresh=True), reverse=True)
        except OSError:  # nothing saved yet
            return 0
        for path in found:
            if path.rsplit("/", 1)[-1].startswith("step-") and (step := self.complete(self.url(path))):
                return step
        return 0

    def save(self, step: int, hold: Path) -> str:
        directory = f"{self.root}/{step_name(step)}"
        if step in _saved and self.complete(self.url(directory)) == step:
            return self.url(directory)
        data = payload(step)
        if hold.exists():
            journal("half_written", step=step)
            while hold.exists():  # the suite kills us here
                pause(0.02)
        slow_disk()
        self.fs.pipe_file(f"{directory}/state.bin", data)
        manifest = {"step": step, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        slow_disk()
        journal("committing", step=step)  # from here the checkpoint may be complete before `saved` says so
        self.fs.pipe_file(f"{directory}/{MANIFEST}", json.dumps(manifest).encode())
        journal("saved", step=step, url=self.url(directory))
        _saved.add(step)
        return self.url(directory)


# -- heartbeats -------------------------------------------------------------------------------------


class Heartbeat:
    def __init__(self, lease_s: float):
        api = urlsplit(env["GPUYARD_API_URL"])
        self.host, self.port = api.hostname or "127.0.0.1", api.port or 80
        self.path = f"/v1/attempts/{ATTEMPT}/heartbeat"
        self.token = int(env["GPUYARD_FENCING_TOKEN"])
        self.headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {env['GPUYARD_ATTEMPT_SECRET']}",
        }
        self.lease_s = lease_s
        self.lease_until = time.monotonic() + lease_s  # the launcher reserved it just now
        self.last_sent = 0.0

    def lapsed(self) -> bool:
        return time.monotonic() > self.lease_until

    def beat(self, step: int, checkpoint: dict[str, Any] | None) -> str | None:
        """The answer's action, or None when the control plane could not be reached (three tries,
        like the runtime's client)."""
        for delay in (0.2, 0.4, None):
            if (action := self._post(step, checkpoint)) is not None or delay is None:
                return action
            pause(delay)
        return None

    def _post(self, step: int, checkpoint: dict[str, Any] | None) -> str | None:
        body = json.dumps({"fencing_token": self.token, "step": step, "checkpoint": checkpoint})
        sent = self.last_sent = time.monotonic()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=3)
        try:
            connection.request("POST", self.path, body, self.headers)
            response = connection.getresponse()
            answer = response.read()
        except OSError as error:
            journal("beat_failed", step=step, error=str(error)[:120])
            return None
        finally:
            connection.close()
        if response.status in (401, 409):  # the attempt ended (its secret with it), or a stale token
            journal("stale", step=step)
            leave(exit_codes.STALE_FENCING_TOKEN)
        if response.status != 200:
            journal("beat_failed", step=step, error=f"HTTP {response.status}")
            return None
        parsed = json.loads(answer)
        self.lease_until = sent + float(parsed.get("lease_seconds") or self.lease_s)
        journal("beat", step=step, checkpoint=checkpoint["step"] if checkpoint else None)
        return str(parsed["action"])


# -- the run ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--fail-at", type=int)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    args = parser.parse_args()
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks.py asks a leftover what it does
    url = env["GPUYARD_CHECKPOINT_URL"]
    store = ObjectStore(url) if not url.startswith("file:") else None
    root = Path(urlsplit(url).path)
    hold = Path(env["FAULTS_DIR"]) / "hold" / ATTEMPT
    journal("start", steps=args.steps)
    began = time.monotonic()
    # The checkpoint the store recorded when it is complete, else the newest complete one (the runtime's
    # rule: training/checkpoint.py, find_latest).
    resume = env.get("GPUYARD_RESUME_URL")
    step = None
    if resume:
        step = store.complete(resume) if store else complete(Path(urlsplit(resume).path))
    if resume and step is None:
        journal("recorded_incomplete", url=resume)
    if step is None:
        step = store.newest_complete() if store else newest_complete(root)[0]
    journal("resume", step=step, url=resume, began=began)
    heartbeat = Heartbeat(args.lease_seconds)

    def checkpoint_now() -> dict[str, Any] | None:
        if RANK != 0:
            return None
        if heartbeat.lapsed():
            journal("save_skipped", step=step, why="lease lapsed")
            return None
        try:
            return {"url": store.save(step, hold) if store else save(root, step, hold), "step": step}
        except OSError as error:
            journal("save_failed", step=step, error=str(error)[:120])
            leave(exit_codes.FAILURE, reason="checkpoint write failed")
        return None  # unreachable: leave() exits

    while step < args.steps:
        pause(args.step_seconds)
        step += 1
        journal("step", step=step)
        if args.fail_at is not None and step >= args.fail_at:
            leave(args.exit_code, reason="the job's own failure")
        saved = checkpoint_now() if step % args.save_every == 0 else None
        action = None
        if saved or time.monotonic() - heartbeat.last_sent >= BEAT_EVERY_S:
            action = heartbeat.beat(step, saved)
        if stop or action == "checkpoint_and_stop":
            saved = checkpoint_now()
            heartbeat.beat(step, saved)
            leave(exit_codes.PREEMPTED, step=step, saved=saved is not None)
    leave(exit_codes.SUCCESS, step=step)


if __name__ == "__main__":
    main()
