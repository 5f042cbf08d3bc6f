"""The CLI as a user runs it: `gpuyard up` in its own home, then client commands against it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuyard.cli.jobs import jobs_table
from servers import GpuyardUp, job_state, wait_until

pytestmark = pytest.mark.slow  # a `gpuyard up` and a CLI process per command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flights-delay.yaml"


def gpuyard(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"gpuyard {args} exited {result.returncode}: {result.stderr}")
    return result


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    server = GpuyardUp(tmp_path_factory.mktemp("up") / "home").start()
    gpuyard(server.home, "token", "create", "--team", "a")  # team a exists whichever test runs first
    yield server.home
    # uvicorn re-raises the signal after its graceful shutdown, which removed server.json
    assert server.stop() in (0, -signal.SIGTERM)
    assert not (server.home / "server.json").exists()


def test_up_announces_url_and_admin_token(home: Path) -> None:
    assert json.loads((home / "server.json").read_text())["url"].startswith("http://127.0.0.1:")
    token_file = home / "admin.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().startswith("gy_")


def write_job(path: Path, name: str, code: str, gpus: int = 1) -> Path:
    spec = {
        "name": name,
        "team": "a",
        "image": "python:3.11-slim",
        "command": ["python", "-c", code],
        "resources": {"gpus": gpus, "gpu_types": ["cpu"]},
        "retry": {"max_failures": 0},
    }
    path.write_text(json.dumps(spec))
    return path


def test_a_job_runs_to_completion_with_its_logs(home: Path, tmp_path: Path) -> None:
    token = gpuyard(home, "token", "create", "--team", "a").stdout.strip()
    code = "import os; e = os.environ; print('rank', e['RANK'], 'of', e['WORLD_SIZE'], e['GPUYARD_JOB_ID'])"
    job = json.loads(
        gpuyard(
            home,
            "submit",
            str(write_job(tmp_path / "j.yaml", "hello", code, gpus=2)),
            "--token",
            token,
            "--wait",
            "--json",
        ).stdout
    )
    assert job["state"] == "SUCCEEDED", job
    logs = gpuyard(home, "logs", job["id"], "--token", token).stdout
    assert f"[rank0] rank 0 of 2 {job['id']}" in logs and f"[rank1] rank 1 of 2 {job['id']}" in logs
    shown = json.loads(gpuyard(home, "show", job["id"], "--json").stdout)
    assert [a["state"] for a in shown["attempts"]] == ["SUCCEEDED"]
    assert [e["type"] for e in shown["events"]][:2] == ["job.submitted", "job.scheduled"]
    table = gpuyard(home, "show", job["id"]).stdout
    assert "SUCCEEDED" in table and "attempt.succeeded" in table
    listed = json.loads(gpuyard(home, "jobs", "--json", "--state", "SUCCEEDED").stdout)
    assert job["id"] in [j["id"] for j in listed]
    fleet = json.loads(gpuyard(home, "fleet", "--json").stdout)
    assert [(n["gpu_type"], n["gpus"], n["free_gpus"]) for n in fleet] == [("cpu", 2, 2)]
    assert "(CPU slots)" in gpuyard(home, "fleet").stdout


def test_cancel_stops_a_running_job(home: Path, tmp_path: Path) -> None:
    spec = write_job(tmp_path / "sleep.yaml", "sleeper", "import time; time.sleep(120)")
    job = json.loads(gpuyard(home, "submit", str(spec), "--json").stdout)
    wait_until(lambda: job_state(home, job["id"]) == "RUNNING", timeout_s=60, what="the job to run")
    assert "stop requested" in gpuyard(home, "cancel", job["id"]).stdout
    wait_until(
        lambda: job_state(home, job["id"]) == "CANCELLED", timeout_s=60, what="the job to be cancelled"
    )
    again = gpuyard(home, "cancel", job["id"], check=False)
    assert again.returncode == 2 and "already CANCELLED" in again.stderr


def test_submit_wait_exits_non_zero_when_the_job_fails(home: Path, tmp_path: Path) -> None:
    spec = write_job(tmp_path / "fail.yaml", "failing", "raise SystemExit(3)")
    result = gpuyard(home, "submit", str(spec), "--wait", "--json", check=False)
    assert result.returncode == 1
    job = json.loads(result.stdout)
    assert job["state"] == "FAILED" and "exited 3" in job["reason"]


def test_bad_input_is_named(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nteam: a\nimage: i\ncommand: [run]\ncolour: red\nresources: {gpus: 3, nodes: 2}\n"
    )
    result = gpuyard(home, "submit", str(bad), check=False)
    assert result.returncode == 2
    assert "colour: Extra inputs are not permitted" in result.stderr
    assert "resources: gpus (3) must split evenly over nodes (2)" in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert "not valid YAML" in gpuyard(home, "submit", str(broken), check=False).stderr
    role = gpuyard(home, "token", "create", "--team", "a", "--role", "owner", check=False)
    assert role.returncode == 2 and "owner" in role.stderr


def test_client_without_a_server_says_how_to_start_one(tmp_path: Path) -> None:
    result = gpuyard(tmp_path, "jobs", check=False)
    assert result.returncode == 1 and "gpuyard up --home" in result.stderr


def test_contradictory_settings_fail_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("profile: production\ndatabase_url: sqlite:///x.db\nbus: redis\n")
    result = gpuyard(tmp_path, "token", "create", "--team", "a", check=False)
    assert result.returncode == 1
    assert "database_url" in result.stderr and "PostgreSQL" in result.stderr


def test_a_launcher_no_registry_holds_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("launcher: slurm\n")  # checked where the parts are composed
    result = gpuyard(tmp_path, "migrate", check=False)
    assert result.returncode == 1
    assert "launcher: expected one of ['kubernetes', 'local'], got 'slurm'" in result.stderr


def test_tokens_are_listed_and_revoked_and_their_lifetime_is_bounded(home: Path) -> None:
    admin = gpuyard(home, "token", "create", "--team", "c", "--role", "team-admin").stdout.strip()
    member = json.loads(
        gpuyard(home, "token", "create", "--team", "c", "--expires-in", "7d", "--json").stdout
    )
    listed = json.loads(gpuyard(home, "token", "list", "--token", admin, "--json").stdout)
    assert {t["id"] for t in listed} == {admin.split("_")[1], member["token"].split("_")[1]}
    assert member["token"].split("_", 2)[2] not in json.dumps(listed)  # no secret is ever listed
    assert "c" in gpuyard(home, "token", "list", "--token", admin).stdout
    gpuyard(home, "token", "revoke", member["token"].split("_")[1], "--token", admin)
    refused = gpuyard(home, "jobs", "--token", member["token"], check=False)
    assert refused.returncode == 1 and "revoked" in refused.stderr
    too_long = gpuyard(home, "token", "create", "--team", "c", "--expires-in", "400d", check=False)
    assert too_long.returncode == 2 and "at most 365 days" in too_long.stderr


def test_team_quota_policy_and_secrets_from_the_cli(home: Path, tmp_path: Path) -> None:
    gpuyard(home, "team", "quota", "d", "--gpu-quota", "2", "--max-gpus-per-job", "1")
    gpuyard(home, "team", "policy", "d", "--registries", "ghcr.io/acme", "--priorities", "low")
    roots = "local=s3://ckpt/d,local=gs://shared/d"
    gpuyard(home, "team", "policy", "d", "--checkpoint-roots", roots)
    shown = json.loads(gpuyard(home, "team", "show", "d", "--json").stdout)[0]
    assert shown["quota"]["gpu_quota"] == 2 and shown["quota"]["max_gpus_per_job"] == 1
    assert shown["policy"]["allowed_registries"] == ["ghcr.io/acme"]  # kept by the second call
    assert shown["policy"]["checkpoint_roots"] == {"local": ["s3://ckpt/d", "gs://shared/d"]}
    assert "ghcr.io/acme" in gpuyard(home, "team", "list").stdout
    member = gpuyard(home, "token", "create", "--team", "d").stdout.strip()
    spec = json.loads(write_job(tmp_path / "j.json", "tagged", "print(1)").read_text())
    (tmp_path / "d.json").write_text(json.dumps({**spec, "team": "d"}))
    refused = gpuyard(home, "submit", str(tmp_path / "d.json"), "--token", member, check=False)
    assert refused.returncode == 2 and "may use images from ['ghcr.io/acme']" in refused.stderr
    team_admin = gpuyard(home, "token", "create", "--team", "d", "--role", "team-admin").stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuyard.cli",
            "secret",
            "set",
            "db-password",
            "--team",
            "d",
            "--token",
            team_admin,
            "--home",
            str(home),
        ],
        input="hunter2\n",
        text=True,
        env=env,
        check=True,
        capture_output=True,
    )
    names = json.loads(gpuyard(home, "secret", "list", "--team", "d", "--token", member, "--json").stdout)
    assert names == [{"team": "d", "name": "db-password"}]
    denied = gpuyard(home, "secret", "delete", "db-password", "--team", "d", "--token", member, check=False)
    assert denied.returncode == 1 and "team-admin" in denied.stderr


def test_a_yaml_alias_bomb_is_refused_before_it_expands(home: Path, tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")  # under 500 bytes; 9^9 strings once expanded
    refused = gpuyard(home, "submit", str(bomb), check=False)
    assert refused.returncode == 2 and "aliases (*name) are not allowed" in refused.stderr
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: " + "x" * (1 << 20) + "\n")
    too_big = gpuyard(home, "submit", str(huge), check=False)
    assert too_big.returncode == 2 and "over the limit" in too_big.stderr


def test_the_jobs_table_shows_an_elastic_jobs_range_of_gpus() -> None:
    job = {"id": "j", "name": "n", "team": "a", "state": "PENDING", "attempt_count": 0}
    job["created_at"] = "2026-12-06T10:00:00+00:00"
    shown = [
        {**job, "spec": {"resources": {"gpus": gpus, "gpu_types": types}}}
        for gpus, types in (({"min": 1, "max": 8}, []), (2, ["a100"]))
    ]
    assert list(jobs_table(shown).columns[4].cells) == ["1-8 x any", "2 x a100"]
