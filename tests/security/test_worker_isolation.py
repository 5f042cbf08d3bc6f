"""Hostile jobs against `gpuyard up` run as root with `worker_users=on`: a worker reads neither the
control plane's home nor another team's files, processes or environment, and a planted secret is
found nowhere it should not be.

The hostile jobs are shell commands, runnable by a worker user wherever this suite's Python
environment lives. The training job is Python: it needs an environment every user may reach
(`worker_env.python_job_needs`), as `make install` builds it (from /usr/bin/python3.11, in an open
clone); one under /root (pyenv's, mode 0700) fails the test naming the closed directory, and an
interpreter under a closed directory is refused (`on`) naming it, rather than run as root. The server
gets credentials of its own in its environment; the control plane's home is where the jobs are told
it is. One world-writable directory (`open_dir`) stands for what both teams can reach.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gpuyard.launchers import worker_env
from gpuyard.launchers.local import _processes_of
from servers import GpuyardUp, wait_until, without_gpuyard_settings
from sqlalchemy import create_engine, text

from training.data import write_synthetic

pytestmark = pytest.mark.slow  # workers as their teams' users

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
def server(tmp_path: Path) -> Iterator[GpuyardUp]:
    if os.geteuid() != 0:
        pytest.fail("workers change user only under a root launcher: run this suite as root (make test does)")
    up = GpuyardUp(
        tmp_path / "home",
        without_gpuyard_settings(
            GPUYARD_WORKER_DIR=str(ROOT), GPUYARD_WORKER_USERS="on", AWS_SECRET_ACCESS_KEY=SERVER_CREDENTIAL
        ),
    )
    try:
        yield up.start()
    finally:
        attempts = list((up.home / "attempts").iterdir()) if (up.home / "attempts").exists() else []
        with contextlib.suppress(AssertionError):
            up.stop()
        for directory in attempts:
            for pid in _processes_of(directory.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            worker_env.remove_sandbox(directory.name)


def cli(home: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args, "--home", str(home)],
        input=stdin,
        env=without_gpuyard_settings(),
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
    server: GpuyardUp, open_dir: Path
) -> None:
    home, admin, url = server.home, server.admin_token, server.url
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

    checkpoint = open_dir / "team-a"
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
    server.stop()
    assert PLANTED not in server.output()


# Team b's training job, in Python: what it may not read, then the training runtime as `python -m
# training.run` would run it (heartbeats, checkpoints to GPUYARD_CHECKPOINT_URL, MLflow).
TRAIN = r"""
import os, sys
for path in sys.argv[1:4]:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
        print("PROBE READ", path, flush=True)
    except OSError as error:
        print("PROBE denied", path, type(error).__name__, flush=True)
print("PROBE uid", os.getuid(), os.getgid(), flush=True)
from training.run import main
sys.exit(main(["--config", sys.argv[4]]))
"""


def training_config(path: Path, data: Path, workdir: Path) -> Path:
    """A small config: its MLflow store is the job's own (sqlite in its team's workdir)."""
    config = {
        "seed": 7,
        "workdir": str(workdir),
        "data": {"path": str(data), "label_column": "is_delayed"},
        "model": {"hidden": [8]},
        "train": {"max_steps": 6, "global_batch_size": 32, "lr": 0.01},
        "checkpoint": {"interval_steps": 3, "keep_last": 2},
        "heartbeat": {"interval_s": 1.0},
        "mlflow": {"enabled": True, "log_model": False, "system_metrics": False},
    }
    path.write_text(json.dumps(config))
    return path


@pytest.mark.slow  # torch and MLflow start in the worker: about 25 s idle, a minute on a loaded machine
def test_a_python_training_job_runs_as_its_team_s_user_and_reads_nothing_of_the_control_plane(
    server: GpuyardUp, open_dir: Path, tmp_path: Path
) -> None:
    home = server.home
    http = httpx.Client(base_url=server.url, timeout=30)
    tokens = {team: cli(home, "token", "create", "--team", team).strip() for team in ("a", "b")}

    def run(spec: dict[str, Any], team: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {tokens[team]}"}
        response = http.post("/v1/jobs", json=spec, headers=headers)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]

        def ended() -> dict[str, Any] | None:
            shown = http.get(f"/v1/jobs/{job_id}", headers=headers).json()
            return shown if shown["state"] in ("SUCCEEDED", "FAILED") else None

        found: dict[str, Any] = wait_until(ended, timeout_s=120, what=f"team {team}'s job")
        found["logs"] = http.get(f"/v1/jobs/{job_id}/logs", headers=headers).text
        return found

    weights = open_dir / "team-a" / "weights.bin"
    write = f"import os; os.makedirs({str(weights.parent)!r}); open({str(weights)!r}, 'w').write('a')"
    data = open_dir / "flights.parquet"
    write_synthetic(str(data), rows=200, features=4, seed=3)
    config = training_config(open_dir / "train.json", data, open_dir / "team-b")
    targets = [str(home / "admin.token"), str(home / "gpuyard.db"), str(weights)]
    command = ["python", "-c", TRAIN, *targets, str(config)]
    spec = job("train", "b", command, checkpoint={"url": (open_dir / "team-b" / "ckpt").as_uri()})
    closed = next(filter(None, map(worker_env._closed_to_others, worker_env.python_job_needs(ROOT))), None)
    if closed is not None:
        pytest.fail(
            f"worker users cannot run this environment's Python ({closed}): build it as make install does"
        )
    hidden = tmp_path / "python"  # under pytest's tmp_path, mode 0700
    hidden.symlink_to(sys.executable)
    refused = run(job("hidden", "b", [str(hidden), "-c", "pass"]), "b")
    assert refused["state"] == "FAILED" and "is closed to other users" in refused["reason"], refused
    assert str(hidden) in refused["reason"]
    assert run(job("weights", "a", ["python", "-c", write]), "a")["state"] == "SUCCEEDED"
    trained = run(spec, "b")
    assert trained["state"] == "SUCCEEDED", trained
    shown = trained["logs"].splitlines()
    lines = [line.removeprefix("PROBE ") for line in shown if line.startswith("PROBE ")]
    assert [line.split()[:2] for line in lines[:3]] == [["denied", t] for t in targets], lines
    uid, gid = (int(n) for n in lines[3].split()[1:])
    identities = json.loads((home / "attempts" / worker_env.IDENTITIES_FILE).read_text())
    assert uid == gid == identities["b"] != identities["a"] >= worker_env.WORKER_UID_BASE
    # What it wrote is its team's alone: its checkpoints, its events and its own MLflow store.
    written = [p for p in (open_dir / "team-b").rglob("*") if p.is_file()]
    assert {"events.jsonl", "mlflow.db", "manifest.json"} <= {p.name for p in written}, written
    assert all(p.stat().st_uid == uid and stat.S_IMODE(p.stat().st_mode) == 0o600 for p in written)
    assert trained["attempts"][0]["checkpoint_url"].startswith((open_dir / "team-b" / "ckpt").as_uri())
    http.close()
