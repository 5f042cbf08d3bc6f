"""`make demo`: the control plane end to end on the embedded defaults, as a user would drive it.

Starts `gpuyard up` in its own home, creates team a's token, submits examples/flights-delay.yaml,
shows the stored job and its published event, then shuts the server down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from gpuyard.client import SERVER_FILE, GpuyardClient, resolve_endpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flights-delay.yaml"
console = Console()


def _gpuyard(home: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args, "--home", str(home)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"gpuyard {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="gpuyard-demo-"))
    console.rule("1. gpuyard up (embedded: SQLite store, in-process bus, local CPU slots)")
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "up", "--home", str(home), "--port", "0"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (home / SERVER_FILE).exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("gpuyard up did not start; see its output above")
            time.sleep(0.1)
        console.rule("2. a token for team a")
        token = _gpuyard(home, "token", "create", "--team", "a").strip()
        console.print(f"token: {token[:12]}... (printed once)")
        console.rule(f"3. gpuyard submit {EXAMPLE.relative_to(ROOT)}")
        console.print(_gpuyard(home, "submit", str(EXAMPLE), "--token", token))
        endpoint = resolve_endpoint(token=token, home=home)
        with GpuyardClient(endpoint) as client:
            job = next(client.jobs(limit=1))
            console.rule(f"4. gpuyard show {job['id']}")
            console.print(_gpuyard(home, "show", job["id"], "--token", token))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                published = _published(home, job["id"])
                if published:
                    break
                time.sleep(0.1)
            console.print(
                f"outbox relay published {len(published)} event(s) of {job['id']}: {json.dumps(published)}"
            )
            if not published:
                raise SystemExit("the relay did not publish the job's event")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    console.rule("done")
    console.print(f"state of this demo instance: {home}")
    return 0


def _published(home: Path, job_id: str) -> list[str]:
    import sqlite3

    with sqlite3.connect(home / "gpuyard.db") as conn:
        rows = conn.execute(
            "SELECT type FROM events WHERE job_id = ? AND published_at IS NOT NULL ORDER BY seq", (job_id,)
        )
        return [row[0] for row in rows]


if __name__ == "__main__":
    raise SystemExit(main())
