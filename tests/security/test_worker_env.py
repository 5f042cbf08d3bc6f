"""The local launcher's worker environment, identities, own directories and privilege drop, piece by piece."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
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


def test_a_worker_gets_the_allowlist_its_spec_and_secrets_and_nothing_of_the_server(
    tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    job = request(attempt_id, env={"MODE": "fast"}, env_from_secret={"API_KEY": "api-key"})
    sandbox = worker_env.prepare(
        job,
        tmp_path / "attempts",
        secrets,
        team_users=False,
        inherited=SERVER_ENV,
        passthrough=("TZ", "NOPE"),
    )
    env = sandbox.environment({"RANK": "0", "GPUYARD_ATTEMPT_ID": attempt_id})
    assert env["LANG"] == "C.UTF-8" and env["TZ"] == "UTC"
    assert env["MODE"] == "fast" and env["API_KEY"] == "the-value"
    assert env["RANK"] == "0" and env["GPUYARD_ATTEMPT_ID"] == attempt_id
    assert env["PATH"] == f"{Path(sys.executable).parent}:{worker_env.SYSTEM_PATH}"
    assert env["HOME"] == env["TMPDIR"] == str(sandbox.directory)
    leaked = [k for k, v in env.items() if "/srv" in v or "credential" in v or "pw@" in v]
    assert leaked == [] and "GPUYARD_HOME" not in env and "PYTHONPATH" not in env and "NOPE" not in env
    assert stat.S_IMODE(sandbox.directory.stat().st_mode) == 0o700
    assert sandbox.directory.parent == worker_env.sandboxes_root()
    passed = worker_env.prepare(
        job,
        tmp_path / "attempts",
        secrets,
        team_users=False,
        inherited=SERVER_ENV,
        passthrough=("PYTHONPATH",),
    )
    assert passed.environment({})["PYTHONPATH"] == "/srv/gpuyard/plugins"  # the operator chose to


def test_a_job_naming_a_missing_secret_does_not_start(
    tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    job = request(attempt_id, env_from_secret={"API_KEY": "api-key", "OTHER": "gone"})
    with pytest.raises(SecretNotFound, match="team a has no secret named 'gone'"):
        worker_env.prepare(job, tmp_path / "attempts", secrets, team_users=False)
    other_team = request(attempt_id, team="b", env_from_secret={"API_KEY": "api-key"})
    with pytest.raises(SecretNotFound):  # team b cannot name team a's secret
        worker_env.prepare(other_team, tmp_path / "attempts", secrets, team_users=False)


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
        worker_env._check_runnable_by_others(str(interpreter))


@as_root
def test_the_workers_own_directory_belongs_to_its_team_s_user(
    tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    job = request(attempt_id, command=["sh", "-c", "true"])
    sandbox = worker_env.prepare(job, tmp_path / "attempts", secrets, team_users=True, inherited={})
    assert sandbox.identity is not None and sandbox.identity.name == "gpuyard-a"
    found = sandbox.directory.stat()
    assert (found.st_uid, found.st_gid) == (sandbox.identity.uid, sandbox.identity.gid)
    drop = [sys.executable, "-m", "gpuyard.launchers.privilege_drop"]
    assert sandbox.command(["sh", "-c", "true"]) == [
        *drop,
        str(sandbox.identity.uid),
        str(sandbox.identity.gid),
        "--",
        "sh",
        "-c",
        "true",
    ]
    with pytest.raises(worker_env.SandboxError, match="not found on the workers' PATH"):
        worker_env.prepare(
            request(attempt_id, command=["no-such-tool"]), tmp_path / "attempts", secrets, team_users=True
        )


@as_root
def test_auto_changes_users_only_where_every_user_may_run_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        base.chmod(0o755)
        (base / "open").mkdir(mode=0o755)
        (base / "closed").mkdir(mode=0o700)
        for place in ("open", "closed"):
            (base / place / "python").write_text("#!/bin/sh\n")
            (base / place / "python").chmod(0o755)
        monkeypatch.setattr(sys, "executable", str(base / "open" / "python"))
        assert worker_env.team_users("auto") and worker_env.team_users("on")
        assert not worker_env.team_users("off")
        monkeypatch.setattr(sys, "executable", str(base / "closed" / "python"))
        assert not worker_env.team_users("auto")  # workers stay the launcher's user, with a warning
        assert worker_env.team_users("on")  # on: each job's command is checked at launch instead
