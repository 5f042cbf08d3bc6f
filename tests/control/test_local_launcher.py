"""The local launcher with real processes, signals and exit codes, driven by the real scheduler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from gpuyard.api.app import create_app
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers.base import LaunchRequest, Outcome
from gpuyard.launchers.inventory import LocalInventory
from gpuyard.launchers.local import LocalLauncher, _alive, _processes_of
from gpuyard.launchers.processes import start_time
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings import Settings
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from servers import GpuyardUp, wait_until, without_gpuyard_settings
from sqlalchemy import Engine

from training import exit_codes

pytestmark = pytest.mark.slow  # real worker processes

WORKER = Path(__file__).parent / "workers" / "checkpointing_worker.py"
CPU = LocalInventory("cpu", 2, 0.0, False)


@pytest.fixture
def api_url(settings: Settings, engine: Engine) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, engine, fleet=CPU.fleet()), host="127.0.0.1", port=0, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the API")
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def scheduler(engine: Engine, api_url: str, tmp_path: Path) -> Iterator[SchedulerService]:
    with engine.begin() as conn:
        team_store.set_quota(
            conn,
            "a",
            TeamQuota(gpu_quota=2),
            utcnow(),
        )
    launcher = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    service = SchedulerService(
        engine, launcher, CPU.fleet(), api_url=lambda: api_url, lease_ttl_s=30, grace_s=10
    )
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), kwargs={"interval_s": 0.2, "observe_s": 0.1})
    thread.start()
    yield service
    stop.set()
    thread.join(timeout=20)
    for directory in (tmp_path / "attempts").iterdir():  # never leave workers behind
        for pid in _processes_of(directory.name):
            os.kill(pid, signal.SIGKILL)


def submit(engine: Engine, name: str, command: list[str], *, gpus: int = 1, **changes: Any) -> str:
    spec = {
        "name": name,
        "team": "a",
        "image": "local",
        "command": command,
        "resources": {"gpus": gpus, "gpu_types": ["cpu"]},
        **changes,
    }
    job, _ = job_store.submit(
        engine,
        parse_spec(spec),
        idempotency_key=None,
        created_by="t",
        at=utcnow(),
    )
    return job.id


def job(engine: Engine, job_id: str) -> Any:
    found = job_store.detail(engine, job_id)
    assert found is not None
    return found


def test_worker_killed_with_sigkill_fails_the_attempt_and_the_job_retries(
    engine: Engine, scheduler: SchedulerService
) -> None:
    job_id = submit(
        engine,
        "victim",
        ["python", "-c", "import time; time.sleep(600)"],
        retry={"max_failures": 1, "backoff": 0.1},
    )
    wait_until(lambda: job(engine, job_id).job.state.value == "RUNNING", what="running")
    attempt_id = job(engine, job_id).attempts[0].id
    wait_until(lambda: len(workers_of(attempt_id)) == 1, what="the worker under its shim")
    workers = workers_of(attempt_id)
    os.kill(workers[0], signal.SIGKILL)
    wait_until(lambda: job(engine, job_id).attempts[0].state.value == "FAILED", what="the attempt to fail")
    first = job(engine, job_id).attempts[0]
    assert "killed by signal 9" in (first.reason or "") and first.exit_code == -9
    wait_until(lambda: len(job(engine, job_id).attempts) == 2, what="a retry")
    assert job(engine, job_id).job.failures == 1


def test_a_preempted_worker_resumes_from_its_checkpoint(
    engine: Engine, scheduler: SchedulerService, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    slow = submit(
        engine,
        "slow",
        [sys.executable, str(WORKER), "40", "0.1"],
        gpus=2,
        priority="low",
        preemptible=True,
        checkpoint={"url": checkpoints.as_uri(), "interval": "auto"},
    )
    wait_until(
        lambda: (
            (job(engine, slow).attempts or [None])[0] is not None
            and (job(engine, slow).attempts[0].step or 0) >= 3
        ),
        what="progress",
    )
    urgent = submit(engine, "urgent", ["python", "-c", "print('urgent done')"], gpus=2, priority="high")
    wait_until(
        lambda: job(engine, urgent).job.state.value == "SUCCEEDED", timeout_s=60, what="the urgent job"
    )
    wait_until(lambda: job(engine, slow).job.state.value == "SUCCEEDED", timeout_s=90, what="the slow job")
    detail = job(engine, slow)
    assert [a.state.value for a in detail.attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert detail.attempts[0].exit_code == exit_codes.PREEMPTED and detail.job.failures == 0
    resumed_at = detail.attempts[0].checkpoint_step
    assert resumed_at is not None and resumed_at > 0
    logs = "".join(scheduler.launcher.logs(detail.attempts[1].id))
    assert f"resumed from step {resumed_at}" in logs and "finished at step 40" in logs


def gang(
    attempt_id: str, *, sleep_s: float, launched_before: bool = False, command: list[str] | None = None
) -> LaunchRequest:
    """A launch of two workers that sleep, then exit 0 (or run `command`)."""
    spec = parse_spec(
        {
            "name": "x",
            "team": "a",
            "image": "i",
            "command": command or ["python", "-c", f"import time; time.sleep({sleep_s})"],
            "resources": {"gpus": 2, "gpu_types": ["cpu"]},
        }
    )
    placement = Placement("local", "local", "local", (NodeSlice("local", (0, 1)),))
    return LaunchRequest(
        attempt_id,
        "job-x",
        1,
        7,
        f"secret-of-{attempt_id}",
        spec,
        placement,
        "http://127.0.0.1:9",
        None,
        launched_before=launched_before,
    )


def test_restarted_launcher_adopts_workers_and_kills_orphans(tmp_path: Path) -> None:
    def request(attempt_id: str) -> LaunchRequest:
        return gang(attempt_id, sleep_s=3, launched_before=True)

    first = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    first.launch(request("kept"))
    first.launch(request("orphan"))
    # launch returns once the shims run; each starts its worker on its own time
    wait_until(
        lambda: len(_processes_of("kept")) >= 2 and len(_processes_of("orphan")) >= 2,
        what="both gangs' processes",
    )
    del first  # the launcher's process "died"; its workers did not
    second = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    reports = second.reconcile({"kept": request("kept"), "vanished": request("vanished")})
    assert [(r.attempt_id, r.outcome) for r in reports] == [("vanished", Outcome.LOST)]
    second.launch(request("kept"))  # a duplicate launch after the restart: no second set of workers
    wait_until(lambda: not _processes_of("orphan"), what="orphans killed")
    assert len(shims("kept")) == 2
    seen: list[Any] = []
    wait_until(
        lambda: bool(seen.extend(r for r in second.observe() if r.outcome != Outcome.RUNNING) or seen),
        what="the adopted workers to finish",
    )
    assert seen[0].outcome == Outcome.SUCCEEDED


def test_two_replicas_launching_one_attempt_start_one_set_of_workers_and_both_follow_it(
    tmp_path: Path,
) -> None:
    """A replica whose lead passed mid-pass and the next leader's recovery both launch the attempt
    they see reserved: the launch lock makes the second follow the first's workers."""
    request = gang("shared", sleep_s=2)
    old, new = (
        LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off") for _ in range(2)
    )
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda launcher: launcher.launch(request), (old, new)))
    followed = {tuple(launcher._attempts["shared"].workers) for launcher in (old, new)}
    assert len(followed) == 1 and len(next(iter(followed))) == 2  # one gang of two, followed by both
    wait_until(lambda: len(shims("shared")) == 2, what="the gang's two shims to start")
    assert set(shims("shared")) == {w.pid for w in next(iter(followed))}  # and no second gang
    assert old.alive() == new.alive() == {"shared": 7}
    ended: list[Any] = []
    wait_until(
        lambda: bool(ended.extend(r for r in new.observe() if r.outcome != Outcome.RUNNING) or ended),
        what="the followed workers to finish",
    )
    assert ended[0].outcome == Outcome.SUCCEEDED


def test_a_launch_that_fails_half_way_leaves_no_worker_running(tmp_path: Path, small_disk: Any) -> None:
    """The node's disk is full: the workers start, but their record (workers.json) cannot be
    written. The launch fails, and the workers it had started are gone: the scheduler records the
    attempt as not started, so nothing of it may run on."""
    launcher = LocalLauncher(small_disk.path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    small_disk.fill()
    with pytest.raises(OSError, match="No space left on device"):
        launcher.launch(gang("half-way", sleep_s=30))
    assert _processes_of("half-way") == [] and launcher.alive() == {}


WAIT_FOR = (
    "import pathlib, time\nwhile not pathlib.Path({release!r}).exists(): time.sleep(0.1)\nprint('done')"
)


def shims(attempt_id: str) -> list[int]:
    """The attempt's shims; a shim's child between its fork and the worker's exec still reads as a
    shim (same command line) and is left out."""
    found: dict[int, int] = {}
    for pid in _processes_of(attempt_id):
        try:
            if b"gpuyard.launchers.shim" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found[pid] = int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
    return [pid for pid, parent in found.items() if parent not in found]


@pytest.mark.slow
def test_gpuyard_up_killed_mid_run_keeps_one_set_of_workers(
    tmp_path: Path, open_dir: Path, request: pytest.FixtureRequest
) -> None:
    home = tmp_path / "home"
    release = open_dir / "release"  # where the job's worker, maybe its team's user, can see it

    def start() -> GpuyardUp:
        server = GpuyardUp(home)
        request.addfinalizer(server.kill)  # never left running, whatever fails
        return server.start()

    def cli(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", *args, "--home", str(home)],
            env=without_gpuyard_settings(),
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    server = start()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "steady",
                "team": "platform",
                "image": "local",
                # runs until the test releases it: adopted alive however long the restart takes
                "command": ["python", "-c", WAIT_FOR.format(release=str(release))],
                "resources": {"gpus": 2, "gpu_types": ["cpu"]},
            }
        )
    )
    job_id = json.loads(cli("submit", str(spec), "--json"))["id"]
    wait_until(lambda: server.state(job_id) == "RUNNING", timeout_s=60, what="running")
    attempt_id = json.loads(cli("show", job_id, "--json"))["attempts"][0]["id"]
    server.kill()  # the whole control plane dies; the workers live on
    assert len(shims(attempt_id)) == 2
    server = start()
    try:
        assert len(shims(attempt_id)) == 2  # adopted after the restart, not started again
        release.touch()
        wait_until(
            lambda: server.state(job_id) == "SUCCEEDED", timeout_s=90, what="the adopted job to finish"
        )
        detail = json.loads(cli("show", job_id, "--json"))
        assert len(detail["attempts"]) == 1  # never launched twice
        assert "done" in cli("logs", job_id)
    finally:
        server.stop()


def workers_of(attempt_id: str) -> list[int]:
    """The attempt's worker commands (not their shims)."""
    return [pid for pid in _processes_of(attempt_id) if pid not in shims(attempt_id)]


def test_a_worker_killed_with_its_shim_is_lost_and_resumes_from_its_checkpoint(
    engine: Engine, scheduler: SchedulerService, tmp_path: Path
) -> None:
    """The whole process group SIGKILLed (as an OOM kill of the container or a dying node would): no
    exit status, so LOST, which spends no budget; the retry resumes from the newest checkpoint."""
    job_id = submit(
        engine,
        "vanishing",
        [sys.executable, str(WORKER), "30", "0.1"],
        retry={"max_failures": 0},
        checkpoint={"url": (tmp_path / "ckpt").as_uri(), "interval": "auto"},
    )
    wait_until(
        lambda: any((a.checkpoint_step or 0) >= 5 for a in job(engine, job_id).attempts), what="a checkpoint"
    )
    first = job(engine, job_id).attempts[0]
    os.killpg(shims(first.id)[0], signal.SIGKILL)
    wait_until(lambda: job(engine, job_id).job.state.value == "SUCCEEDED", timeout_s=60, what="the retry")
    detail = job(engine, job_id)
    assert [a.state.value for a in detail.attempts] == ["LOST", "SUCCEEDED"]
    assert detail.job.failures == 0 and "vanished" in (detail.attempts[0].reason or "")
    resumed = detail.attempts[1].checkpoint_step
    logs = "".join(scheduler.launcher.logs(detail.attempts[1].id))
    assert f"resumed from step {detail.attempts[0].checkpoint_step}" in logs, (resumed, logs)


def test_a_worker_outliving_its_killed_shim_is_stopped_before_the_job_is_placed_again(
    engine: Engine, scheduler: SchedulerService
) -> None:
    """Only the shim SIGKILLed: its worker lives on, orphaned. The launcher must not report the
    attempt ended (and so let the job be placed again) while that worker runs."""
    job_id = submit(engine, "orphaned", ["python", "-c", "import time; time.sleep(600)"], gpus=2)
    wait_until(lambda: job(engine, job_id).job.state.value == "RUNNING", what="running")
    first = job(engine, job_id).attempts[0]
    wait_until(lambda: len(workers_of(first.id)) == 2, what="both workers")
    orphans = workers_of(first.id)
    launch = scheduler.launcher.launch
    overlaps: list[list[int]] = []

    def probe(request: Any) -> None:  # at the moment the next attempt starts: is the old one gone?
        overlaps.append([pid for pid in orphans if _alive(pid)])  # a zombie has ended
        launch(request)

    scheduler.launcher.launch = probe  # type: ignore[method-assign]
    os.kill(shims(first.id)[0], signal.SIGKILL)
    # The next attempt is reserved (in the store) before it is launched: wait for its launch.
    wait_until(lambda: overlaps, timeout_s=30, what="the next attempt launched")
    assert len(job(engine, job_id).attempts) == 2
    assert job(engine, job_id).attempts[0].state.value == "LOST"
    assert overlaps == [[]], f"workers of the lost attempt still ran when the next one started: {overlaps}"
    assert not _processes_of(first.id)


def test_a_worker_pid_reused_after_a_restart_is_not_taken_for_the_worker(tmp_path: Path) -> None:
    """The machine restarted: the attempt's workers are gone and one of their pids now belongs to
    a stranger (a process leading its own group, as a shim does). The restarted launcher adopts the
    record but sees no worker alive: the attempt is LOST, and the stranger is never signalled."""
    request = gang("reused", sleep_s=60, launched_before=True)
    first = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    first.launch(request)
    assert first.release("reused")  # the workers died with the machine
    record_path = tmp_path / "attempts" / "reused" / "workers.json"
    record = json.loads(record_path.read_text())
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        while start_time(stranger.pid) in record["started"]:  # started in the same clock tick
            stranger.kill()
            stranger.wait()
            stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
        record["pids"][0] = stranger.pid  # the kernel gave that pid to another process
        record_path.write_text(json.dumps(record))
        second = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
        assert second.reconcile({"reused": request}) == []  # adopted: its record is there
        assert second.alive() == {}
        (report,) = [r for r in second.observe() if r.outcome != Outcome.RUNNING]
        assert report.outcome == Outcome.LOST and "vanished" in (report.reason or "")
        second.cancel("reused", grace_s=0)
        second.release("reused")
        assert stranger.poll() is None  # never signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_a_paused_process_holding_a_launch_lock_holds_up_no_other_launch(
    engine: Engine, tmp_path: Path
) -> None:
    """A replica paused in the middle of launching attempt one (SIGSTOP, holding its launch lock):
    the next leader's recovery gives up on that attempt after the lock's wait, leaves it reserved,
    and launches attempt two."""
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=2), utcnow())
    launcher = LocalLauncher(
        tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off", launch_lock_wait_s=0.5
    )
    service = SchedulerService(engine, launcher, CPU.fleet(), api_url=lambda: "http://127.0.0.1:9")
    jobs = [submit(engine, f"j{i}", ["sleep", "60"]) for i in range(2)]
    wanted = [
        Reservation(j, Placement("local", "local", "local", (NodeSlice("local", (i,)),)), False)
        for i, j in enumerate(jobs)
    ]
    one, two = reserve_batch(engine, wanted, at=utcnow(), lease_ttl_s=60)
    assert one is not None and two is not None
    lock = tmp_path / "attempts" / one.id / "launch.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, signal, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX);"
            " print('locked', flush=True); os.kill(os.getpid(), signal.SIGSTOP)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        wait_until(
            lambda: Path(f"/proc/{holder.pid}/stat").read_text().split(") ")[1][0] == "T", what="paused"
        )
        with ThreadPoolExecutor(1) as pool:
            pool.submit(service.recover).result(timeout=20)  # never waits on the paused process
        states = {a.id: a.state.value for j in jobs for a in job(engine, j).attempts}
        assert states == {one.id: "CREATED", two.id: "LAUNCHING"}
        assert len(shims(two.id)) == 1 and shims(one.id) == []
    finally:
        holder.kill()
        holder.wait()
        for attempt_id in (one.id, two.id):
            for pid in _processes_of(attempt_id):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_killed_at_the_grace_periods_end_has_its_status_recorded(tmp_path: Path) -> None:
    """A worker that outlives its preemption's grace period (here it ignores SIGTERM; in the fault
    suite, a final heartbeat and teardown on a loaded machine) is SIGKILLed, and its shim, which the
    kill spares, records the status: the attempt ended by the platform's kill, not a worker that
    vanished (seed 602 of issue 28's run: shim and worker killed together, the attempt LOST)."""
    ready = tmp_path / "ready"
    request = gang(
        "stubborn",
        sleep_s=60,
        command=[
            "python",
            "-c",
            "import os, pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            " pathlib.Path(sys.argv[1] + '-' + os.environ['RANK']).touch(); time.sleep(60)",
            str(ready),
        ],
    )
    launcher = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    launcher.launch(request)
    wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 2, what="both workers ignoring SIGTERM")
    launcher.cancel("stubborn", grace_s=0.5)
    report = wait_until(
        lambda: next((r for r in launcher.observe() if r.outcome != Outcome.RUNNING), None),
        what="the attempt's end",
    )
    assert report.exit_code == -signal.SIGKILL and report.disrupted
    assert "vanished" not in (report.reason or "")
    assert launcher.release("stubborn")


def test_a_gangs_rendezvous_port_is_drawn_below_the_ephemeral_range(tmp_path: Path) -> None:
    """Rank 0 binds MASTER_PORT seconds after the launch (torch's import): a port of the ephemeral
    range, which every outgoing connection draws from, may be taken by then."""
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    write = "import os, sys; open(sys.argv[1] + os.environ['RANK'], 'w').write(os.environ['MASTER_PORT'])"
    launcher = LocalLauncher(tmp_path / "attempts", CPU, workdir=tmp_path, worker_users="off")
    launcher.launch(gang("ports", sleep_s=0, command=["python", "-c", write, str(tmp_path / "port-")]))
    ended: list[Any] = []
    wait_until(
        lambda: bool(ended.extend(r for r in launcher.observe() if r.outcome != Outcome.RUNNING) or ended),
        what="the gang to finish",
    )
    assert ended[0].outcome == Outcome.SUCCEEDED, ended[0]
    ports = {int((tmp_path / f"port-{rank}").read_text()) for rank in (0, 1)}
    assert len(ports) == 1 and next(iter(ports)) < floor, (ports, floor)
