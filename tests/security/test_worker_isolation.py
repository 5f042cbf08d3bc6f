"""Hostile jobs against `gpuyard up` run as root with `worker_users=on`: a worker reads neither the
control plane's home nor another team's files, processes or environment, and a planted secret is
found nowhere it should not be.

The jobs are shell commands: a worker user must be able to run a job's command, and this suite's
Python environment may live where other users cannot enter (its `auto` mode then keeps workers as
root; `test_worker_env.py` checks that rule). The server gets credentials of its own in its
environment; the control plane's home is where the jobs are told it is. One shared, world-writable
directory stands for what both teams can reach.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gpuyard.launchers import worker_env
from gpuyard.launchers.local import _processes_of
from servers import wait_until
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "planted-secret-0d5e1c7a9b"
SERVER_CREDENTIAL = "server-credential-4b8f"

# Team b's probe: every read it tries, and what came of it, one line each.
PROBE = r"""
try() { if $1 "$2" >/dev/null 2>&1; then echo "PROBE READ $2"; else echo "PROBE denied $2"; fi; }
try cat "$TARGET_HOME/admin.token"
try cat "$TARGET_HOME/gpuyard.db"
try ls "$TARGET_HOME/secrets"
try ls "$TARGET_HOME/attempts"
try cat "$TARGET_FILE"
try ls "$(dirname "$TARGET_FILE")"
for p in /proc/[0-9]*; do
  if grep -qa "GPUYARD_JOB_ID=$TARGET_JOB" "$p/environ" 2>/dev/null; then echo "PROBE ENVIRON $p"; fi
done
echo "PROBE uid $(id -u)"
echo "PROBE cwd $(pwd)"
env | sed 's/^/PROBE env /'
"""

# Team a's job: its secret checked by digest (never printed), a private file, then a wait.
VICTIM = r"""
printf %s "$API_KEY" | sha256sum | sed 's/^/digest /'
mkdir -p "$1" && echo "team a's weights" > "$1/weights.bin"
echo "uid $(id -u) written"
sleep 60
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory both teams can reach and write (like /tmp), outside pytest's private tmp_path."""
    directory = Path(tempfile.mkdtemp(prefix="gpuyard-shared-"))
    directory.chmod(0o1777)
    yield directory
    subprocess.run(["rm", "-rf", str(directory)], check=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    if os.geteuid() != 0:
        pytest.fail("workers change user only under a root launcher: run this suite as root (make test does)")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    env |= {
        "GPUYARD_WORKER_DIR": str(ROOT),
        "GPUYARD_WORKER_USERS": "on",
        "AWS_SECRET_ACCESS_KEY": SERVER_CREDENTIAL,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "up", "--home", str(home), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    wait_until(lambda: (home / "server.json").exists() or process.poll() is not None, timeout_s=60, what="up")
    assert process.poll() is None, process.stdout.read() if process.stdout else ""
    yield home, process
    attempts = list((home / "attempts").iterdir()) if (home / "attempts").exists() else []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.communicate(timeout=30)
    for directory in attempts:
        for pid in _processes_of(directory.name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker_env.remove_sandbox(directory.name)


def cli(home: Path, *args: str, stdin: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args, "--home", str(home)],
        input=stdin,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def job(name: str, team: str, command: list[str], **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": team,
        "image": "local",
        "command": command,
        "resources": {"gpus": 1, "gpu_types": ["cpu"]},
        "retry": {"max_failures": 0},
        **fields,
    }


def test_hostile_jobs_read_nothing_of_the_control_plane_or_each_other_and_the_secret_stays_put(
    server: tuple[Path, subprocess.Popen[str]], shared: Path
) -> None:
    home, process = server
    admin = (home / "admin.token").read_text().strip()
    url = json.loads((home / "server.json").read_text())["url"]
    tokens = {team: cli(home, "token", "create", "--team", team).strip() for team in ("a", "b")}
    team_admin_a = cli(home, "token", "create", "--team", "a", "--role", "team-admin").strip()
    cli(home, "secret", "set", "api-key", "--team", "a", "--token", team_admin_a, stdin=PLANTED)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    http = httpx.Client(base_url=url, timeout=30)
    headers = {"Authorization": f"Bearer {admin}"}

    def submit(spec: dict[str, Any], team: str) -> str:
        response = http.post("/v1/jobs", json=spec, headers={"Authorization": f"Bearer {tokens[team]}"})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def logs(job_id: str) -> str:
        return http.get(f"/v1/jobs/{job_id}/logs", headers=headers).text

    def state(job_id: str) -> str:
        return str(http.get(f"/v1/jobs/{job_id}", headers=headers).json()["state"])

    checkpoint = shared / "team-a"
    victim = submit(
        job(
            "victim", "a", ["sh", "-c", VICTIM, "sh", str(checkpoint)], env_from_secret={"API_KEY": "api-key"}
        ),
        "a",
    )
    def written() -> str | None:
        shown = logs(victim)
        return shown if "written" in shown else None

    logs_a = wait_until(written, timeout_s=60, what="team a's job to write its file")
    assert f"digest {hashlib.sha256(PLANTED.encode()).hexdigest()}" in logs_a  # the worker had the value
    probe_env = {
        "TARGET_HOME": str(home),
        "TARGET_FILE": str(checkpoint / "weights.bin"),
        "TARGET_JOB": victim,
    }
    probe = submit(job("probe", "b", ["sh", "-c", PROBE], env=probe_env), "b")
    wait_until(lambda: state(probe) in ("SUCCEEDED", "FAILED"), timeout_s=60, what="the probe")
    lines = [line.removeprefix("PROBE ") for line in logs(probe).splitlines() if line.startswith("PROBE ")]

    reads = [line for line in lines if line.startswith(("READ", "denied"))]
    assert len(reads) == 6 and all(line.startswith("denied") for line in reads), lines
    assert not [line for line in lines if line.startswith("ENVIRON")], lines  # nor team a's environment
    uid_b = int(next(line for line in lines if line.startswith("uid ")).split()[1])
    uid_a = int(logs_a.split("uid ", 1)[1].split()[0])
    assert worker_env.WORKER_UID_BASE <= uid_a != uid_b >= worker_env.WORKER_UID_BASE
    env = dict(
        line.removeprefix("env ").split("=", 1) for line in lines if line.startswith("env ") and "=" in line
    )
    assert not [
        k for k, v in env.items() if (str(home) in v or SERVER_CREDENTIAL in v) and k != "TARGET_HOME"
    ]
    assert "GPUYARD_HOME" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"].startswith(str(worker_env.sandboxes_root())) and env["USER"] == "gpuyard-b"
    cwd = next(line for line in lines if line.startswith("cwd ")).removeprefix("cwd ")
    assert not cwd.startswith(str(home))

    # The planted secret: nowhere in the API's answers, the store, the control plane's files or output.
    answers = [
        http.get(path, headers=headers).text
        for path in (
            f"/v1/jobs/{victim}",
            f"/v1/jobs/{victim}/logs",
            "/v1/jobs",
            "/v1/fleet",
            "/v1/metrics/summary",
            "/v1/teams",
            "/v1/teams/a/secrets",
            "/v1/tokens",
            "/metrics",
        )
    ]
    assert not [a for a in answers if PLANTED in a]
    engine = create_engine(f"sqlite:///{home / 'gpuyard.db'}")
    with engine.connect() as conn:
        names = [r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'"))]
        rows = [repr(row) for name in names for row in conn.execute(text(f'SELECT * FROM "{name}"'))]
    engine.dispose()
    assert rows and not [r for r in rows if PLANTED in r]
    files = [p for p in home.rglob("*") if p.is_file() and "secrets" not in p.relative_to(home).parts]
    assert files and not [p for p in files if PLANTED.encode() in p.read_bytes()]
    http.post(f"/v1/jobs/{victim}/cancel", headers=headers)
    http.close()
    os.killpg(process.pid, signal.SIGTERM)
    server_output = process.communicate(timeout=30)[0]
    assert PLANTED not in server_output
