"""The local launcher (embedded default): one process per worker of the gang, on this machine.

Each worker runs under `gpuyard.launchers.shim` in its own process group, with torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and gpuyard's
(GPUYARD_API_URL, GPUYARD_ATTEMPT_ID, GPUYARD_FENCING_TOKEN, GPUYARD_CHECKPOINT_URL, GPUYARD_JOB_ID),
in the sandbox `worker_env` builds: an environment from nothing but an allowlist, the spec and its
secrets, a directory of its own, and, where the launcher is root, its team's unprivileged user.
Everything about an attempt lives in `<root>/<attempt id>/`: `workers.json` (each shim by pid and
start time, so that a pid reused after a restart is never taken for it, and the fencing token), one
log and one exit-status file per rank, and `ended` once the store has the attempt's
end. That directory is what lets a restarted launcher (or another scheduler replica on this machine)
adopt running workers, deliver an ending the store never got, or clean up orphans. Every worker
process also carries its attempt id in its environment, a label found in /proc even when no pid
file was written: `release` kills by that label.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpuyard.clock import Clock, utcnow
from gpuyard.launchers import worker_env
from gpuyard.launchers.base import (
    EXIT_PREEMPTED,
    LaunchBusy,
    LaunchRequest,
    Outcome,
    WorkerReport,
    outcome_of_exit,
)
from gpuyard.launchers.filelock import LockBusy, exclusive
from gpuyard.launchers.inventory import LocalInventory
from gpuyard.launchers.processes import Proc
from gpuyard.secrets.files import FileSecretStore, home_store

# How long a launch waits for another process launching the same attempt: far longer than a launch
# takes (spawning the gang), far shorter than a lease.
LAUNCH_LOCK_WAIT_S = 5.0
# A shim writes its worker's status as soon as the worker is killed; one still there this long after
# the grace period's SIGKILL is stuck, and goes with its group.
SHIM_EXIT_S = 5.0
RENDEZVOUS_PORTS_FROM = 20000


_draw = random.SystemRandom()


def _free_port() -> int:
    """The gang's rendezvous port (MASTER_PORT), drawn below the kernel's ephemeral range where it has
    room: rank 0 binds it only once torch is imported, seconds later, and a port from bind(0) is one
    every outgoing connection may take meanwhile (the rendezvous then fails, charged to the job).
    The emulated cluster draws its servers' ports by the same rule (local_cluster.services)."""
    try:
        ceiling = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ceiling = 32768  # Linux's default
    for _ in range(200):
        port = (
            _draw.randrange(RENDEZVOUS_PORTS_FROM, ceiling) if ceiling > RENDEZVOUS_PORTS_FROM + 1000 else 0
        )
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free rendezvous port from {RENDEZVOUS_PORTS_FROM} to {ceiling} after 200 draws")


def _processes_of(attempt_id: str) -> list[int]:
    """Every process on this machine whose environment says it works for `attempt_id` (a label,
    like a pod's): the truth about an attempt's workers even when a pid file was never written."""
    wanted = f"GPUYARD_ATTEMPT_ID={attempt_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0") and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _kill_label(attempt_id: str, *, wait_s: float) -> bool:
    """SIGKILL every process labelled with the attempt; True once none is left (within `wait_s`)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _processes_of(attempt_id)
        if not found:
            return True
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _recorded_workers(directory: Path) -> list[Proc] | None:
    """The workers (shims) an attempt's launch recorded, by pid and start time; None before any was
    (or once the record was torn)."""
    try:
        record = json.loads((directory / "workers.json").read_text())
        return [
            Proc(int(pid), int(started))
            for pid, started in zip(record["pids"], record["started"], strict=True)
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class _Attempt:
    directory: Path
    workers: list[Proc]  # each rank's shim, the leader of its process group
    token: int
    children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)  # ours, not adopted
    running_acknowledged: bool = False
    ending: WorkerReport | None = None  # decided once every worker ended; repeated until acknowledged
    kill_at: float | None = None  # monotonic deadline of SIGKILL after a cancel
    asked_to_stop: bool = False  # the scheduler cancelled it: how it ends is the platform's doing
    stopping_gang: bool = False  # one worker ended badly: the others are being stopped

    def exit_status(self, rank: int) -> int | None:
        """The worker's status from the shim's file; for a shim that is our child and could not write
        it (a full disk), the shim's own exit code, which carries the same status."""
        try:
            return int((self.directory / f"rank{rank}.exit").read_text())
        except (OSError, ValueError):
            pass
        child = self.children.get(self.workers[rank].pid)
        if child is None or child.returncode is None or child.returncode < 0:
            return None  # adopted, still running, or the shim itself was killed: no status
        code = child.returncode
        return -(code - 128) if code > 128 else code  # the shim exits 128 + N for a worker killed by N


class LocalLauncher:
    def __init__(
        self,
        root: Path,
        inventory: LocalInventory,
        *,
        workdir: Path | None = None,
        clock: Clock = utcnow,
        secrets: FileSecretStore | None = None,
        worker_users: worker_env.WorkerUsers = "auto",
        passthrough: tuple[str, ...] = (),
        launch_lock_wait_s: float = LAUNCH_LOCK_WAIT_S,
    ):
        self.root, self.inventory, self.clock = root, inventory, clock
        self.launch_lock_wait_s = launch_lock_wait_s
        self.workdir = workdir or Path.cwd()
        self.secrets = secrets or home_store(root.parent)  # root is <home>/attempts
        self.users = worker_env.user_rule(worker_users, worker_env.python_job_needs(self.workdir))
        self.passthrough = passthrough
        self.root.mkdir(parents=True, exist_ok=True)
        self._attempts: dict[str, _Attempt] = {}

    # -- launch and cancel -------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> None:
        if request.attempt_id in self._attempts:
            return
        directory = self.root / request.attempt_id
        directory.mkdir(parents=True, exist_ok=True)
        # Two replicas may launch one attempt (one whose lead just passed, and the next leader's
        # recovery): the first starts the workers, the second follows them. Never a second set. A
        # holder that takes longer is stuck (paused): waiting for it would stop every other launch.
        try:
            with exclusive(directory / "launch.lock", wait_s=self.launch_lock_wait_s):
                if (workers := _recorded_workers(directory)) is not None:
                    self._attempts[request.attempt_id] = _Attempt(directory, workers, request.fencing_token)
                    return
                self._start(request, directory)
        except LockBusy as busy:
            raise LaunchBusy(
                f"attempt {request.attempt_id} is being launched by another process ({busy})"
            ) from busy

    def _start(self, request: LaunchRequest, directory: Path) -> None:
        # Secrets, identity and own directory first: a job that cannot have them does not start.
        sandbox = worker_env.prepare(
            request,
            self.root,
            self.secrets,
            users=self.users,
            workdir=self.workdir,
            passthrough=self.passthrough,
        )
        if strays := _processes_of(request.attempt_id):
            # A launcher died between starting workers and recording them: stop them, start afresh.
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        world = max(1, sum(len(piece.gpu_indices) for piece in request.placement.slices))
        children: dict[int, subprocess.Popen[bytes]] = {}
        try:
            workers = self._spawn(request, directory, sandbox, world, children)
        except BaseException:
            # Nothing of a launch that failed half way may run on: the scheduler records it as not
            # started (a full disk refusing workers.json after the workers began, for one).
            for process in children.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            worker_env.remove_sandbox(request.attempt_id)
            raise
        self._attempts[request.attempt_id] = _Attempt(directory, workers, request.fencing_token, children)

    def _spawn(
        self,
        request: LaunchRequest,
        directory: Path,
        sandbox: worker_env.WorkerSandbox,
        world: int,
        children: dict[int, subprocess.Popen[bytes]],
    ) -> list[Proc]:
        """Start the gang's workers into `children`, then record them in workers.json."""
        gpus = [gpu for piece in request.placement.slices for gpu in piece.gpu_indices]
        port = _free_port()
        for rank in range(world):
            env = {
                **request.env,
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GPUYARD_API_URL": request.api_url,
                "GPUYARD_ATTEMPT_ID": request.attempt_id,
                "GPUYARD_JOB_ID": request.job_id,
                "GPUYARD_FENCING_TOKEN": str(request.fencing_token),
                "GPUYARD_ATTEMPT_SECRET": request.attempt_secret,
                "GPUYARD_CHECKPOINT_URL": request.checkpoint_url or "",
                "GPUYARD_GPU_TYPE": self.inventory.gpu_type,
            }
            # CPU slots: no device, honest about having no GPU
            env["CUDA_VISIBLE_DEVICES"] = str(gpus[rank]) if self.inventory.real_gpus else ""
            with open(directory / f"rank{rank}.log", "ab") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",  # isolated: the shim runs as the launcher, with nothing the job chose
                        "-m",
                        "gpuyard.launchers.shim",
                        str(directory / f"rank{rank}.exit"),
                        *sandbox.shim_arguments(),
                        "--",
                        *request.spec.command,
                    ],
                    cwd=self.workdir,
                    env=sandbox.helper_environment(request.attempt_id),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE,
                    start_new_session=True,  # its own process group: signals reach the worker's children
                )
            children[process.pid] = process
            assert process.stdin is not None
            with process.stdin:  # the worker's environment, which only its exec applies
                process.stdin.write(json.dumps(sandbox.environment(env)).encode())
        workers = [Proc.of(pid) for pid in children]  # not waited for yet: each at least a zombie
        record = {
            "pids": [w.pid for w in workers],
            "started": [w.started for w in workers],
            "job_id": request.job_id,
            "fencing_token": request.fencing_token,
        }
        partial = directory / "workers.tmp"
        partial.write_text(json.dumps(record))
        os.replace(partial, directory / "workers.json")
        return workers

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        tracked = self._attempts.get(attempt_id)
        if tracked is None:
            return
        tracked.asked_to_stop = True
        self._stop(tracked, grace_s)

    def _stop(self, tracked: _Attempt, grace_s: float) -> None:
        self._signal(tracked, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        tracked.kill_at = deadline if tracked.kill_at is None else min(tracked.kill_at, deadline)
        if grace_s <= 0:
            self._kill_workers(tracked)

    @staticmethod
    def _kill_workers(tracked: _Attempt) -> None:
        """The grace period is over: SIGKILL the workers, as a kubelet kills a container, but not their
        shims, which record how the workers ended (a worker killed while it tore down after exiting
        its training is a status, not a worker that vanished); a stuck shim goes later."""
        assert tracked.kill_at is not None
        shims_too = time.monotonic() >= tracked.kill_at + SHIM_EXIT_S
        for worker in tracked.workers:
            if shims_too:
                worker.signal_group(signal.SIGKILL)
            else:
                worker.signal_followers(signal.SIGKILL)

    @staticmethod
    def _signal(tracked: _Attempt, signum: int) -> None:
        for worker in tracked.workers:
            worker.signal_group(signum)

    # -- observing ------------------------------------------------------------------------------

    def observe(self) -> list[WorkerReport]:
        reports = []
        for attempt_id, tracked in self._attempts.items():
            if tracked.ending is None:
                tracked.ending = self._ending(attempt_id, tracked)
            if tracked.ending is not None:
                reports.append(tracked.ending)
            elif not tracked.running_acknowledged and not tracked.stopping_gang:
                reports.append(WorkerReport(attempt_id, Outcome.RUNNING, self.clock()))
        return reports

    def acknowledge(self, report: WorkerReport) -> None:
        tracked = self._attempts.get(report.attempt_id)
        if tracked is None:
            return
        if report.outcome == Outcome.RUNNING:
            tracked.running_acknowledged = True
            return
        (tracked.directory / "ended").write_text(report.outcome.value)
        del self._attempts[report.attempt_id]
        worker_env.remove_sandbox(report.attempt_id)  # every worker ended: its HOME and TMPDIR go

    def starting(self) -> dict[str, int]:
        """None: a local worker is a process from its launch on (`alive` covers it)."""
        return {}

    def alive(self) -> dict[str, int]:
        return {
            attempt_id: tracked.token
            for attempt_id, tracked in self._attempts.items()
            if tracked.ending is None and any(worker.alive() for worker in tracked.workers)
        }

    def release(self, attempt_id: str) -> bool:
        tracked = self._attempts.get(attempt_id)
        if tracked is not None:
            tracked.asked_to_stop = True
            self._signal(tracked, signal.SIGKILL)
            for child in tracked.children.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=2.0)
        return _kill_label(attempt_id, wait_s=5.0)

    def _ending(self, attempt_id: str, tracked: _Attempt) -> WorkerReport | None:
        """How the attempt ended, once every worker has; None while any runs."""
        for child in tracked.children.values():
            child.poll()  # collect exited children so they do not linger as zombies
        if tracked.kill_at is not None and time.monotonic() >= tracked.kill_at:
            self._kill_workers(tracked)
        alive = [worker.alive() for worker in tracked.workers]
        statuses = [tracked.exit_status(rank) for rank in range(len(tracked.workers))]
        failed = [s for s in statuses if s is not None and s not in (0, EXIT_PREEMPTED)]
        if any(alive) and (failed or any(s is None for s, up in zip(statuses, alive, strict=True) if not up)):
            # One worker of the gang is gone badly: the others cannot make progress alone.
            if not tracked.stopping_gang:
                tracked.stopping_gang = True
                self._stop(tracked, grace_s=10.0)
            return None
        if any(alive):
            return None
        if not _kill_label(attempt_id, wait_s=2.0):
            return None  # a worker outlived its killed shim and resists: not ended while it runs
        return replace(self._verdict(attempt_id, statuses), disrupted=tracked.asked_to_stop)

    def _verdict(self, attempt_id: str, statuses: list[int | None]) -> WorkerReport:
        now = self.clock()
        if any(s is None for s in statuses):
            rank = statuses.index(None)
            return WorkerReport(
                attempt_id,
                Outcome.LOST,
                now,
                None,
                f"worker rank {rank} vanished without an exit status (its process was killed)",
            )
        codes = [s for s in statuses if s is not None]
        for rank, code in enumerate(codes):
            outcome, reason = outcome_of_exit(code)
            if outcome in (Outcome.FAILED, Outcome.LOST):
                return WorkerReport(attempt_id, outcome, now, code, f"rank {rank} {reason}")
        if any(code == EXIT_PREEMPTED for code in codes):
            return WorkerReport(
                attempt_id, Outcome.PREEMPTED, now, EXIT_PREEMPTED, outcome_of_exit(EXIT_PREEMPTED)[1]
            )
        return WorkerReport(attempt_id, Outcome.SUCCEEDED, now, 0, "all workers exited 0")

    # -- after a restart ----------------------------------------------------------------------------

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        for attempt_id in [a for a in self._attempts if a not in live]:
            del self._attempts[attempt_id]  # tracked while another replica led, and ended meanwhile
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir()):
            attempt_id = directory.name
            if attempt_id in self._attempts or (directory / "ended").exists():
                continue
            workers = _recorded_workers(
                directory
            )  # None: the launcher died mid-launch; launch() starts afresh
            if attempt_id in live and workers is not None:
                token = live[attempt_id].fencing_token
                self._attempts[attempt_id] = _Attempt(
                    directory, workers, token
                )  # adopt; observe() follows it
            elif attempt_id not in live:  # an orphan: no live attempt owns these workers
                for worker in workers or ():
                    worker.signal_group(signal.SIGKILL)
                for pid in _processes_of(attempt_id):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                (directory / "ended").write_text("ORPHAN")
                worker_env.remove_sandbox(attempt_id)
        return [
            WorkerReport(
                attempt_id,
                Outcome.LOST,
                self.clock(),
                None,
                "no worker of this attempt is known to this launcher",
                disrupted=True,
            )
            for attempt_id, request in live.items()
            if attempt_id not in self._attempts
            and not (self.root / attempt_id).exists()
            and request.launched_before  # one reserved but never launched is not lost: recover() launches it
            and self.release(attempt_id)  # workers of it elsewhere on this machine (another home) are stopped
        ]

    def launched(self, attempt_id: str) -> bool:
        return (self.root / attempt_id / "workers.json").exists()

    # -- logs ---------------------------------------------------------------------------------------

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        return attempt_logs(self.root / attempt_id, follow=follow)


def attempt_logs(directory: Path, *, follow: bool = False) -> Iterator[str]:
    """The workers' output of one attempt, interleaved by rank; with `follow`, until the attempt ends."""
    logs = sorted(directory.glob("rank*.log"), key=lambda p: int(p.stem.removeprefix("rank")))
    handles = [open(path, errors="replace") for path in logs]  # noqa: SIM115
    prefix = len(logs) > 1
    try:
        while True:
            progressed = False
            for path, handle in zip(logs, handles, strict=True):
                while line := handle.readline():
                    progressed = True
                    yield f"[{path.stem}] {line}" if prefix else line
            if not follow or (not progressed and (directory / "ended").exists()) or not directory.exists():
                return
            if not progressed:
                time.sleep(0.2)
    finally:
        for handle in handles:
            handle.close()
