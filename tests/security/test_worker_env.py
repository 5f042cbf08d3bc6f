"""The local launcher's worker environment, identities, own directories and privilege drop, piece by piece."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from control.conftest import EXAMPLE_SPEC
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers import worker_env
from gpuyard.launchers.base import LaunchRequest, Outcome
from gpuyard.launchers.inventory import LocalInventory
from gpuyard.launchers.local import LocalLauncher
from gpuyard.secrets.files import FileSecretStore, SecretNotFound
from servers import open_directory, wait_until

as_root = pytest.mark.requires(os.geteuid() == 0, "workers change user only where the launcher is root")
LAUNCHERS_USER, TEAM_USERS = worker_env.UserRule(team_users=False), worker_env.UserRule(team_users=True)
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
    return LaunchRequest(attempt_id, "job-1", 1, 7, "s", parsed, placement, "http://127.0.0.1:9", None)


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

    def prepare(*passthrough: str) -> worker_env.WorkerSandbox:
        return worker_env.prepare(
            job,
            tmp_path / "attempts",
            secrets,
            users=LAUNCHERS_USER,
            workdir=tmp_path,
            inherited=SERVER_ENV,
            passthrough=passthrough,
        )

    sandbox = prepare("TZ", "NOPE")
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
    passed = prepare("PYTHONPATH")
    assert passed.environment({})["PYTHONPATH"] == "/srv/gpuyard/plugins"  # the operator chose to


def test_a_job_naming_a_missing_secret_does_not_start(
    tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    job = request(attempt_id, env_from_secret={"API_KEY": "api-key", "OTHER": "gone"})
    with pytest.raises(SecretNotFound, match="team a has no secret named 'gone'"):
        worker_env.prepare(job, tmp_path / "attempts", secrets, users=LAUNCHERS_USER, workdir=tmp_path)
    other_team = request(attempt_id, team="b", env_from_secret={"API_KEY": "api-key"})
    with pytest.raises(SecretNotFound):  # team b cannot name team a's secret
        worker_env.prepare(other_team, tmp_path / "attempts", secrets, users=LAUNCHERS_USER, workdir=tmp_path)


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


def shim(exit_file: Path, *argv: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The launcher's shim run as the launcher runs it: isolated, the worker's environment on stdin."""
    return subprocess.run(
        [sys.executable, "-I", "-m", "gpuyard.launchers.shim", str(exit_file), *argv],
        input=json.dumps(environment),
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


@as_root
def test_the_privilege_drop_leaves_no_group_no_new_privileges_and_a_private_umask(tmp_path: Path) -> None:
    uid = worker_env.WORKER_UID_BASE + 999_999
    probe = "id -u; id -g; id -G; umask; grep NoNewPrivs /proc/self/status; echo $MODE"
    ran = shim(
        tmp_path / "rank0.exit",
        "--as",
        f"{uid}:{uid}",
        "--",
        "/bin/sh",
        "-c",
        probe,
        environment={"PATH": "/usr/bin:/bin", "MODE": "the job's"},
    )
    shown = ran.stdout.split("\n")
    assert shown[:4] == [str(uid), str(uid), str(uid), "0077"], ran.stderr
    assert shown[4].split() == ["NoNewPrivs:", "1"] and shown[5] == "the job's"
    assert (tmp_path / "rank0.exit").read_text().strip() == "0"
    for malformed in (["--as", "x:1", "--", "true"], ["--as", "1", "--", "true"], ["true"]):
        refused = shim(tmp_path / "bad.exit", *malformed, environment={})
        assert refused.returncode == 2 and "gpuyard:" in refused.stderr, malformed
    not_json = subprocess.run(
        [sys.executable, "-I", "-m", "gpuyard.launchers.shim", str(tmp_path / "x.exit"), "--", "true"],
        input='["PATH"]',
        capture_output=True,
        text=True,
    )
    assert not_json.returncode == 2 and "JSON object of strings" in not_json.stderr


@pytest.fixture
def places() -> Iterator[Path]:
    """`open/` and `closed/` (mode 0700) in a directory every user may enter, each with a `python`
    (executable by all) and a link `python-link` to the other one's."""
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        base = Path(scratch)
        base.chmod(0o755)
        for place, mode in (("open", 0o755), ("closed", 0o700)):
            (base / place).mkdir(mode=mode)
            (base / place / "python").write_text("#!/bin/sh\n")
            (base / place / "python").chmod(0o755)
        (base / "open" / "python-link").symlink_to(base / "closed" / "python")
        (base / "closed" / "python-link").symlink_to(base / "open" / "python")
        yield base


@as_root
def test_an_interpreter_or_working_directory_closed_to_others_is_named_before_any_worker_starts(
    places: Path,
) -> None:
    with pytest.raises(worker_env.SandboxError, match=f"{places / 'closed'} is closed to other users"):
        worker_env._check_reachable_by_others(str(places / "closed" / "python"), Path("/"))
    # a link is followed: an open name of a closed interpreter, a closed name of an open one
    for link in (places / "open" / "python-link", places / "closed" / "python-link"):
        with pytest.raises(worker_env.SandboxError, match="closed to other users"):
            worker_env._check_reachable_by_others(str(link), Path("/"))
    with pytest.raises(worker_env.SandboxError, match=r"cannot enter the working directory \(worker_dir\)"):
        worker_env._check_reachable_by_others(str(places / "open" / "python"), places / "closed")
    (places / "open" / "private").mkdir(mode=0o711)  # enterable, not listable: Python cannot import there
    assert "not readable and enterable" in str(worker_env._closed_to_others(places / "open" / "private"))
    worker_env._check_reachable_by_others(str(places / "open" / "python"), places / "open")


@as_root
def test_the_workers_own_directory_belongs_to_its_team_s_user(
    tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    job = request(attempt_id, command=["sh", "-c", "true"])
    sandbox = worker_env.prepare(
        job, tmp_path / "attempts", secrets, users=TEAM_USERS, workdir=Path("/"), inherited={}
    )
    assert sandbox.identity is not None and sandbox.identity.name == "gpuyard-a"
    found = sandbox.directory.stat()
    assert (found.st_uid, found.st_gid) == (sandbox.identity.uid, sandbox.identity.gid)
    assert sandbox.shim_arguments() == ["--as", f"{sandbox.identity.uid}:{sandbox.identity.gid}"]
    assert "PYTHONPATH" not in sandbox.helper_environment(attempt_id)
    with pytest.raises(worker_env.SandboxError, match="not found on the workers' PATH"):
        worker_env.prepare(
            request(attempt_id, command=["no-such-tool"]),
            tmp_path / "attempts",
            secrets,
            users=TEAM_USERS,
            workdir=Path("/"),
        )


@as_root
def test_auto_changes_users_where_every_user_may_reach_what_python_jobs_need_and_else_refuses_jobs(
    places: Path, tmp_path: Path, secrets: FileSecretStore, attempt_id: str
) -> None:
    reachable = [places / "open" / "python", places / "open"]
    assert worker_env.user_rule("auto", reachable) == worker_env.user_rule("on", reachable) == TEAM_USERS
    assert worker_env.user_rule("off", reachable) == LAUNCHERS_USER  # the operator's explicit choice
    for closed in (places / "closed" / "python", places / "open" / "python-link", places / "closed"):
        rule = worker_env.user_rule("auto", [*reachable, closed])
        assert not rule.team_users and rule.refusal is not None and str(places / "closed") in rule.refusal
        with pytest.raises(worker_env.SandboxError, match="worker_users=auto: workers cannot run as"):
            worker_env.prepare(
                request(attempt_id), tmp_path / "attempts", secrets, users=rule, workdir=places
            )
        assert worker_env.user_rule("on", [*reachable, closed]) == TEAM_USERS  # each job checked at launch


def test_what_python_jobs_need_is_this_environment_its_runtime_and_the_working_directory(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; from gpuyard.launchers import worker_env as w; print(*w.python_job_needs(sys.argv[1]))"
    )
    shown = subprocess.run(  # as the launcher sees it (pytest's tests/ on sys.path shadows training/)
        [sys.executable, "-c", code, str(tmp_path)],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    repository = Path(__file__).resolve().parents[2]
    assert shown[0] == sys.executable and shown[-2:] == [str(tmp_path), tempfile.gettempdir()]
    assert sysconfig.get_path("purelib") in shown
    assert {str(repository / "plugins" / "gpuyard"), str(repository / "training")} <= set(shown)


PLANTED_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    FILE *record = fopen(RECORD, "a");
    if (record) { fprintf(record, "preload %d\n", (int)geteuid()); fclose(record); }
}
"""
PLANTED_PY = (
    "import os\nwith open({record!r}, 'a') as f:\n    f.write(f'sitecustomize {{os.geteuid()}}\\n')\n"
)


@as_root
def test_code_a_hostile_job_plants_in_its_environment_never_runs_as_root(attempt_id: str) -> None:
    """A job names a library for the dynamic loader and a module every interpreter runs at start:
    they run in its worker, as its team's user, and in no process of the launcher's (root)."""
    with open_directory() as place:
        record = place / "ran"
        record.touch(mode=0o666)
        record.chmod(0o666)
        (place / "planted.c").write_text(PLANTED_C)
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                f'-DRECORD="{record}"',
                "-o",
                str(place / "planted.so"),
                str(place / "planted.c"),
            ],
            check=True,
        )
        (place / "sitecustomize.py").write_text(PLANTED_PY.format(record=str(record)))
        for planted in ("planted.so", "sitecustomize.py"):
            (place / planted).chmod(0o755)
        job = request(
            attempt_id,
            command=[sys.executable, "-c", "print('trained')"],
            env={"LD_PRELOAD": str(place / "planted.so"), "PYTHONPATH": str(place)},
        )
        launcher = LocalLauncher(
            place / "attempts",
            LocalInventory("cpu", 1, 0.0, False),
            workdir=Path("/"),
            secrets=FileSecretStore(place / "secrets"),
            worker_users="on",
        )
        launcher.launch(job)
        ended = wait_until(
            lambda: next((r for r in launcher.observe() if r.outcome != Outcome.RUNNING), None),
            what="the job to end",
        )
        assert ended.outcome == Outcome.SUCCEEDED, ended
        ran = record.read_text().split("\n")[:-1]
    team_uid = str(worker_env.team_identity(place / "attempts", "a").uid)
    # The plant works (the worker ran both, as its team's user), and nothing ran it as root.
    assert sorted(ran) == sorted([f"preload {team_uid}", f"sitecustomize {team_uid}"]), ran
