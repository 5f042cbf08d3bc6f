"""Hostile jobs against `gpuyard up` run as root: a worker reads neither the control plane's home nor
another team's files, processes or environment, and a planted secret is found nowhere it should not be.

The server gets credentials of its own in its environment; the control plane's home is where the
jobs are told it is. One shared, world-writable directory stands for what both teams can reach.
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

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="workers run as their team's user only where the launcher is root"
)
ROOT = Path(__file__).resolve().parents[2]
PLANTED = "planted-secret-0d5e1c7a9b"
SERVER_CREDENTIAL = "server-credential-4b8f"

# Team b's probe: every read it tries, and what came of it.
PROBE = r"""
import json, os, sys
def attempt(path):
    try:
        if os.path.isdir(path):
            return "LISTED " + ",".join(sorted(os.listdir(path)))
        with open(path, "rb") as handle:
            return "READ " + handle.read(200).decode(errors="replace")
    except OSError as error:
        return "denied: " + type(error).__name__
home = os.environ["TARGET_HOME"]
names = ("admin.token", "gpuyard.db", "secrets", "attempts")
found = {name: attempt(os.path.join(home, name)) for name in names}
found["other team's checkpoint"] = attempt(os.environ["TARGET_FILE"])
found["other team's directory"] = attempt(os.path.dirname(os.environ["TARGET_FILE"]))
environs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    text = attempt(f"/proc/{pid}/environ")
    if text.startswith("READ") and "GPUYARD_JOB_ID=" + os.environ["TARGET_JOB"] in text:
        environs.append(pid)
found["other team's environment"] = environs
shown = {"found": found, "uid": os.getuid(), "env": dict(os.environ), "cwd": os.getcwd()}
print("PROBE " + json.dumps(shown))
"""

# Team a's job: its secret checked by digest (never printed), a private file, then a wait.
VICTIM = r"""
import hashlib, os, sys, time
print("digest", hashlib.sha256(os.environ["API_KEY"].encode()).hexdigest(), flush=True)
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "weights.bin"), "w") as handle:
    handle.write("team a's weights")
print("uid", os.getuid(), "written", flush=True)
time.sleep(60)
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
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    env |= {"GPUYARD_WORKER_DIR": str(ROOT), "AWS_SECRET_ACCESS_KEY": SERVER_CREDENTIAL}
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
    process.wait(timeout=30)
    for directory in attempts:
        for pid in _processes_of(directory.name):
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

    def submit(spec: dict[str, Any], team: str) -> str:
        response = http.post("/v1/jobs", json=spec, headers={"Authorization": f"Bearer {tokens[team]}"})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def state(job_id: str) -> dict[str, Any]:
        return http.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {admin}"}).json()  # type: ignore[no-any-return]

    checkpoint = shared / "team-a"
    victim = submit(
        job("victim", "a", ["python", "-c", VICTIM, str(checkpoint)], env_from_secret={"API_KEY": "api-key"}),
        "a",
    )

    def logs(job_id: str) -> str:
        return http.get(f"/v1/jobs/{job_id}/logs", headers={"Authorization": f"Bearer {admin}"}).text

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
    probe = submit(job("probe", "b", ["python", "-c", PROBE], env=probe_env), "b")
    wait_until(lambda: state(probe)["state"] in ("SUCCEEDED", "FAILED"), timeout_s=60, what="the probe")
    output = logs(probe)
    report = json.loads(
        next(line for line in output.splitlines() if line.startswith("PROBE ")).removeprefix("PROBE ")
    )

    found = report["found"]
    assert all(
        str(found[name]).startswith("denied") for name in ("admin.token", "gpuyard.db", "secrets", "attempts")
    ), found
    assert found["other team's checkpoint"].startswith("denied"), found
    assert found["other team's directory"].startswith("denied"), found
    assert found["other team's environment"] == [], found
    uid_a = int(logs_a.split("uid ", 1)[1].split()[0])
    assert report["uid"] not in (0, uid_a) and uid_a != 0
    env = report["env"]
    assert not [
        k for k, v in env.items() if (str(home) in v or SERVER_CREDENTIAL in v) and k != "TARGET_HOME"
    ]
    assert "GPUYARD_HOME" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"].startswith(str(worker_env.sandboxes_root())) and env["USER"] == "gpuyard-b"
    assert not report["cwd"].startswith(str(home))

    # The planted secret: nowhere in the API's answers, the store, the control plane's files or output.
    headers = {"Authorization": f"Bearer {admin}"}
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


@pytest.mark.slow
def test_a_secret_a_training_run_reads_reaches_no_mlflow_param_tag_or_file(
    server: tuple[Path, subprocess.Popen[str]], shared: Path
) -> None:
    import yaml

    from training.data import write_synthetic

    home, _ = server
    url = json.loads((home / "server.json").read_text())["url"]
    team_admin = cli(home, "token", "create", "--team", "a", "--role", "team-admin").strip()
    cli(home, "secret", "set", "hf-token", "--team", "a", "--token", team_admin, stdin=PLANTED)
    write_synthetic(str(shared / "flights.parquet"), rows=400, features=6, seed=3)
    workdir = shared / "train"
    config = {
        "seed": 7,
        "workdir": str(workdir),
        "data": {"path": str(shared / "flights.parquet"), "label_column": "is_delayed"},
        "model": {"hidden": [8]},
        "train": {"max_steps": 6, "global_batch_size": 32, "lr": 0.01, "warmup_steps": 1},
        "checkpoint": {"interval_steps": 3, "keep_last": 1},
        "mlflow": {
            "enabled": True,
            "experiment": "secret-check",
            "log_model": False,
            "system_metrics": False,
        },
    }
    (shared / "train.yaml").write_text(yaml.safe_dump(config))
    (shared / "train.yaml").chmod(0o644)
    spec = job(
        "trainer",
        "a",
        ["python", "-m", "training.run", "--config", str(shared / "train.yaml")],
        env_from_secret={"HF_TOKEN": "hf-token"},
        checkpoint={"url": (shared / "ckpt").as_uri()},
    )
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {team_admin}"}, timeout=30) as http:
        job_id = http.post("/v1/jobs", json=spec).json()["id"]
        ended = wait_until(
            lambda: (
                (found := http.get(f"/v1/jobs/{job_id}").json())["state"] in ("SUCCEEDED", "FAILED") and found
            ),
            timeout_s=240,
            what="the training job",
        )
        logs = http.get(f"/v1/jobs/{job_id}/logs").text
    assert ended["state"] == "SUCCEEDED", logs[-3000:]
    assert PLANTED not in logs
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "secret-check"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params and run.data.tags
    recorded = [*run.data.params.items(), *run.data.tags.items(), *run.data.metrics]
    assert not [item for item in recorded if PLANTED in str(item)]
    assert not [p for p in workdir.rglob("*") if p.is_file() and PLANTED.encode() in p.read_bytes()]
