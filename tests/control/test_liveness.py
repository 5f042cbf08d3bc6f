"""What keeps an attempt alive, end to end with real processes: a plain command (no heartbeat) lives
on its launcher's renewals; a launcher cut off from the store loses its attempts, whose workers are
stopped before the job is placed again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers.inventory import LocalInventory
from gpuyard.launchers.local import LocalLauncher, _alive, _processes_of
from gpuyard.scheduler.service import SchedulerService
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from servers import GpuyardUp, wait_until, without_gpuyard_settings
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from stores import empty_store

pytestmark = pytest.mark.slow  # a `gpuyard up` running jobs for several lease periods

CPU = LocalInventory("cpu", 1, 0.0, False)


@pytest.mark.slow
def test_a_plain_command_of_three_lease_periods_succeeds_in_one_attempt_through_gpuyard_up(
    tmp_path: Path,
) -> None:
    """The review's user: `python -c "import time; time.sleep(35)"` under a 10 s lease was killed and
    started again every lease period, for ever. Now the launcher renews the lease while it runs."""
    env = without_gpuyard_settings(GPUYARD_LEASE_SECONDS="3")
    home = tmp_path / "home"
    server = GpuyardUp(home, env)

    def cli(*args: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", *args, "--home", str(home), "--json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(done.stdout)

    try:
        server.start()
        spec = tmp_path / "plain.yaml"
        spec.write_text(
            json.dumps(
                {
                    "name": "plain",
                    "team": "platform",
                    "image": "local",
                    "command": ["python", "-c", "import time; time.sleep(10); print('slept')"],
                    "resources": {"gpus": 1, "gpu_types": ["cpu"]},
                }
            )
        )
        job_id = cli("submit", str(spec))["id"]
        wait_until(lambda: server.state(job_id) == "SUCCEEDED", timeout_s=90, what="the plain command")
        detail = cli("show", job_id)
        assert [a["state"] for a in detail["attempts"]] == ["SUCCEEDED"], detail
    finally:
        server.stop()


@pytest.fixture
def admin_engine(postgres_url: str, _postgres_engine: Engine) -> Iterator[Engine]:
    empty_store(_postgres_engine)
    engine = make_engine(postgres_url, pool_size=4)
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=1), utcnow())
    yield engine
    engine.dispose()


@pytest.fixture
def role_url(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A login of its own for one scheduler replica, so the test can cut it off from the store (no new
    connections, its open ones terminated) while every other process still reaches it."""
    role = f"gy_cut_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    yield role, make_url(postgres_url).set(username=role).render_as_string(hide_password=False)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def cut_off(postgres_url: str, role: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {role} NOLOGIN")
        conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")


@pytest.mark.postgres
def test_a_launcher_cut_off_from_the_store_loses_its_attempt_and_no_second_one_runs_beside_it(
    admin_engine: Engine, role_url: tuple[str, str], postgres_url: str, tmp_path: Path
) -> None:
    role, url = role_url
    lease = 3.0
    cut_engine = make_engine(url, pool_size=2)
    spec = parse_spec(
        {
            "name": "plain",
            "team": "a",
            "image": "local",
            "command": ["python", "-c", "import time; time.sleep(600)"],
            "resources": {"gpus": 1, "gpu_types": ["cpu"]},
        }
    )
    job, _ = job_store.submit(admin_engine, spec, idempotency_key=None, created_by="t", at=utcnow())

    def replica(engine: Engine, name: str) -> SchedulerService:
        launcher = LocalLauncher(tmp_path / name, CPU, workdir=tmp_path, worker_users="off")
        return SchedulerService(
            engine,
            launcher,
            CPU.fleet(),
            api_url=lambda: "http://127.0.0.1:9",
            lease_ttl_s=lease,
            holder=name,
        )

    first, second = replica(cut_engine, "first"), replica(admin_engine, "second")
    first.step()
    (attempt,) = [a for a in job_store.detail(admin_engine, job.id).attempts]  # type: ignore[union-attr]
    workers = wait_until(lambda: _processes_of(attempt.id), what="the worker")
    first.step()  # renewed by its launcher while it runs
    cut_off(postgres_url, role)
    with pytest.raises(Exception, match=r"(?i)terminat|login|connection"):
        first.step()  # its renewals fail from now on

    overlap: list[list[int]] = []
    launch = second.launcher.launch

    def probe(request: Any) -> None:  # the moment a next attempt starts: does the cut-off one still run?
        overlap.append([pid for pid in workers if _alive(pid)])
        launch(request)

    second.launcher.launch = probe  # type: ignore[method-assign]
    while not overlap:  # the other replica leads on: it waits out the lease, then reaps
        second.step()
        with admin_engine.connect() as conn:
            state = attempt_store.attempt(conn, attempt.id)
        assert state is not None
        if state.state.value == "LOST":
            assert state.ended_at is not None and state.lease_expires_at is not None
            assert state.ended_at >= state.lease_expires_at  # LOST only after the lease passed
    assert overlap == [[]], f"the lost attempt's worker still ran when the next one started: {overlap}"
    assert not _processes_of(attempt.id)
    for pid in _processes_of(job_store.detail(admin_engine, job.id).attempts[-1].id):  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
    cut_engine.dispose()
