"""The local launcher's worker environment, identities, own directories and privilege drop, piece by piece."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from control.conftest import EXAMPLE_SPEC
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers import worker_env
from gpuyard.launchers.base import LaunchRequest
from gpuyard.secrets.files import FileSecretStore, SecretNotFound

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="workers change user only where the launcher is root")
SERVER_ENV = {
    "GPUYARD_HOME": "/srv/gpuyard",
    "GPUYARD_DATABASE_URL": "postgresql://gpuyard:pw@db/gpuyard",
    "AWS_SECRET_ACCESS_KEY": "server-credential",
    "PYTHONPATH": "/srv/gpuyard/plugins",
    "PATH": "/srv/evil/bin",
    "LANG": "C.UTF-8",
    "TZ": "UTC",
}


def request(attempt_id: str, team: str = "a", **spec: object) -> LaunchRequest:
    parsed = parse_spec({**EXAMPLE_SPEC, "team": team, **spec})
    placement = Placement("local", "local", "local", (NodeSlice("local", (0,)),))
    return LaunchRequest(attempt_id, "job-1", 1, 7, parsed, placement, "http://127.0.0.1:9", None)


@pytest.fixture
def secrets(tmp_path: Path) -> FileSecretStore:
    store = FileSecretStore(tmp_path / "secrets")
    store.put("a", "api-key", "the-value")
    return store


@pytest.fixture
def attempt_id(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"test-{os.getpid()}-{request.node.name}"[:60].replace("[", "-").replace("]", "")
    yield name
    worker_env.remove_sandbox(name)


def test_a_job_naming_a_missing_secret_does_not_start(
    tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    job = request(attempt_id, env_from_secret={"API_KEY": "api-key", "OTHER": "gone"})
    with pytest.raises(SecretNotFound, match="team a has no secret named 'gone'"):
        worker_env.prepare(job, tmp_path / "attempts", secrets)
    other_team = request(attempt_id, team="b", env_from_secret={"API_KEY": "api-key"})
    with pytest.raises(SecretNotFound):  # team b cannot name team a's secret
        worker_env.prepare(other_team, tmp_path / "attempts", secrets)


@as_root
def test_each_team_gets_its_own_user_once_and_for_good(tmp_path: Path) -> None:
    root = tmp_path / "attempts"
    teams = [f"team-{i}" for i in range(8)]
    barrier = threading.Barrier(len(teams))
    given: dict[str, int] = {}

    def allocate(team: str) -> None:
        barrier.wait()  # all at once: the lock, not luck, keeps them apart
        given[team] = worker_env.team_identity(root, team).uid

    threads = [threading.Thread(target=allocate, args=(t,)) for t in teams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(given.values()) == list(range(worker_env.WORKER_UID_BASE, worker_env.WORKER_UID_BASE + 8))
    again = {t: worker_env.team_identity(root, t).uid for t in teams}  # e.g. after a restart
    assert again == given
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


@as_root
def test_the_privilege_drop_leaves_no_group_no_new_privileges_and_a_private_umask() -> None:
    uid = worker_env.WORKER_UID_BASE + 999_999
    probe = "id -u; id -g; id -G; umask; grep NoNewPrivs /proc/self/status"
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuyard.launchers.privilege_drop",
            str(uid),
            str(uid),
            "--",
            "/bin/sh",
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout.split("\n")
    assert shown[:4] == [str(uid), str(uid), str(uid), "0077"]
    assert shown[4].split() == ["NoNewPrivs:", "1"]
    refused = subprocess.run(
        [sys.executable, "-m", "gpuyard.launchers.privilege_drop", "x", "1", "--", "true"],
        capture_output=True,
    )
    assert refused.returncode == 2


@as_root
def test_an_interpreter_in_a_closed_directory_is_named_before_any_worker_starts(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    interpreter = closed / "python"
    interpreter.write_text("#!/bin/sh\n")
    interpreter.chmod(0o755)
    with pytest.raises(worker_env.SandboxError, match="is closed to other users"):
        worker_env._check_runnable_by_others(interpreter)
