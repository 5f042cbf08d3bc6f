"""The CLI as a user runs it: `gpuyard up` in its own home, then client commands against it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import wait_until

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
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "up", "--home", str(home), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    wait_until(
        lambda: (home / "server.json").exists() or server.poll() is not None, timeout_s=60, what="gpuyard up"
    )
    assert server.poll() is None, server.stdout.read() if server.stdout else ""
    yield home
    os.killpg(server.pid, signal.SIGTERM)
    # uvicorn re-raises the signal after its graceful shutdown, which removed server.json
    assert server.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not (home / "server.json").exists()


def test_up_announces_url_and_admin_token(home: Path) -> None:
    assert json.loads((home / "server.json").read_text())["url"].startswith("http://127.0.0.1:")
    token_file = home / "admin.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().startswith("gy_")


def test_submit_list_show_cancel(home: Path) -> None:
    token = gpuyard(home, "token", "create", "--team", "a").stdout.strip()
    submitted = json.loads(gpuyard(home, "submit", str(EXAMPLE), "--token", token, "--json").stdout)
    assert submitted["state"] == "PENDING" and submitted["team"] == "a"
    table = gpuyard(home, "jobs", "--token", token).stdout
    assert submitted["id"][:8] in table and "PENDING" in table
    listed = json.loads(gpuyard(home, "jobs", "--json", "--state", "PENDING").stdout)  # the admin token
    assert submitted["id"] in [job["id"] for job in listed]
    shown = json.loads(gpuyard(home, "show", submitted["id"], "--token", token, "--json").stdout)
    assert [e["type"] for e in shown["events"]] == ["job.submitted"]
    wait_until(lambda: "job.submitted" in gpuyard(home, "show", submitted["id"]).stdout, what="show table")
    cancelled = gpuyard(home, "cancel", submitted["id"], "--token", token)
    assert "CANCELLED" in cancelled.stdout
    again = gpuyard(home, "cancel", submitted["id"], check=False)
    assert again.returncode == 2 and "already CANCELLED" in again.stderr


def test_submit_wait_follows_until_the_end(home: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "gpuyard.cli",
        "submit",
        str(EXAMPLE),
        "--wait",
        "--json",
        "--home",
        str(home),
    ]
    waiting = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    newest = json.loads(gpuyard(home, "jobs", "--json", "--limit", "1").stdout)[0]
    gpuyard(home, "cancel", newest["id"])
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, err
    assert json.loads(out)["state"] == "CANCELLED"


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
