"""`gpuyard scheduler` SIGKILLed between reserving an attempt and launching it, as a real process.

The pause is deterministic: the job names a team secret, which the launcher reads as it launches
(inside the transaction that claims the launch, after the reserve committed), and that secret's
file is a FIFO with no writer: opening it blocks in the kernel (`wait_for_partner`), which /proc
shows, until the process is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import AttemptState, JobState
from gpuyard.launchers.local import _processes_of
from gpuyard.secrets.files import home_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from servers import production_settings, wait_until
from sqlalchemy import Engine

from .conftest import EXAMPLE_SPEC

pytestmark = pytest.mark.slow  # scheduler processes killed and restarted

SECRET = "launch-token"


def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    node = {"name": "node-1", "site": "s", "cluster": "c", "domain": "d", "gpu_type": "cpu", "gpus": 1}
    path.write_text(yaml.safe_dump({"nodes": [node]}))
    return path


def job_naming_a_fifo_secret(engine: Engine, home: Path, marks: Path) -> tuple[str, Path]:
    """A job whose worker marks its attempt id; the team secret it names is a FIFO with no writer."""
    worker = f"import os; open({str(marks)!r}, 'a').write(os.environ['GPUYARD_ATTEMPT_ID'] + '\\n')"
    data: dict[str, Any] = {
        **EXAMPLE_SPEC,
        "name": "launch-held",
        "image": "local",
        "command": [sys.executable, "-c", worker],
        "resources": {"gpus": 1, "gpu_types": ["cpu"]},
        "env_from_secret": {"LAUNCH_TOKEN": SECRET},
    }
    data.pop("checkpoint", None)
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=2), utcnow())
    store = home_store(home)
    store.put("a", SECRET, "placeholder")  # the team's directory, as `gpuyard secrets set` makes it
    fifo = store.root / "a" / SECRET
    fifo.unlink()
    os.mkfifo(fifo, 0o600)
    job, _ = job_store.submit(engine, parse_spec(data), idempotency_key=None, created_by="t", at=utcnow())
    return job.id, fifo


@pytest.fixture
def scheduler_env(
    postgres_url: str, redis_url: str, redis_stream: str, tmp_path: Path
) -> Iterator[dict[str, str]]:
    env = {
        **os.environ,
        **production_settings(postgres_url, redis_url, redis_stream, tmp_path / "home"),
        "GPUYARD_LAUNCHER": "local",
        "GPUYARD_FLEET_FILE": str(fleet_file(tmp_path)),
        "GPUYARD_API_URL": "http://127.0.0.1:9",  # the worker here sends no heartbeats
        "GPUYARD_LEASE_SECONDS": "12",  # the dead leader's lease (half of it) runs out sooner
    }
    yield env
    attempts = tmp_path / "home" / "attempts"
    for directory in attempts.iterdir() if attempts.exists() else ():  # never leave workers behind
        for pid in _processes_of(directory.name):
            os.kill(pid, signal.SIGKILL)


def start_scheduler(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "scheduler"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def opening_a_fifo(process: subprocess.Popen[bytes]) -> bool:
    """Does a thread of `process` wait in the kernel for a FIFO's other end?"""
    for wchan in Path(f"/proc/{process.pid}/task").glob("*/wchan"):
        try:
            if wchan.read_text() == "wait_for_partner":
                return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_scheduler_killed_between_reserve_and_launch_launches_the_attempt_once_after_restart(
    database_url: str, engine: Engine, scheduler_env: dict[str, str], tmp_path: Path, open_dir: Path
) -> None:
    # the worker, maybe its team's user (worker_users), writes its marks where it can
    marks, log = open_dir / "launched.txt", tmp_path / "scheduler.log"
    job_id, fifo = job_naming_a_fifo_secret(engine, tmp_path / "home", marks)

    first = start_scheduler(scheduler_env, log)
    try:
        wait_until(lambda: opening_a_fifo(first), timeout_s=60, what="the launcher to read the job's secret")
        reserved = job_store.detail(engine, job_id).attempts  # type: ignore[union-attr]
        # reserved and committed; the launch's claim is not (it is the transaction around the read)
        assert [a.state for a in reserved] == [AttemptState.CREATED]
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
    assert not marks.exists(), "a worker started before the launch step"

    # The secret becomes an ordinary file; a new scheduler takes over and finishes the job.
    fifo.unlink()
    home_store(tmp_path / "home").put("a", SECRET, "a-token")
    second = start_scheduler(scheduler_env, log)
    try:
        wait_until(
            lambda: job_store.detail(engine, job_id).job.state == JobState.SUCCEEDED,  # type: ignore[union-attr]
            timeout_s=90,
            what=f"the job to succeed (scheduler log: {log})",
        )
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)

    detail = job_store.detail(engine, job_id)
    assert detail is not None
    launched = marks.read_text().split()
    # Launched exactly once, or expired unlaunched and retried: never two attempts' workers.
    assert len(launched) == len(set(launched)) == 1
    by_id = {a.id: a for a in detail.attempts}
    assert by_id[launched[0]].state == AttemptState.SUCCEEDED
    if launched[0] != reserved[0].id:
        assert by_id[reserved[0].id].state in (AttemptState.LOST, AttemptState.FAILED)
