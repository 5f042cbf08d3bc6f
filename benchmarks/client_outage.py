"""The clients across a long API outage: `gpuyard submit --wait` and `gpuyard logs --follow` through a
proxy in front of a real `gpuyard up`, the proxy cut (connections reset, new ones refused) for
`--outage` seconds (60 by default: a restart or a rolling update) while the job ends; then how soon
after the API is back each command ends, and whether it told the right things.

    python benchmarks/client_outage.py [--outage 60]

Prints one JSON object: the outage, each command's exit status and seconds from the heal to its end,
the job's final state as `submit --wait` printed it, and whether `logs --follow` printed every line
exactly once. It reuses the tests' servers (tests/servers.py, tests/faults/proxy.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from faults.proxy import FaultProxy  # noqa: E402
from gpuyard_client import Endpoint, GpuyardClient  # noqa: E402
from servers import GpuyardUp, open_directory, wait_until, without_gpuyard_settings  # noqa: E402

LINES = 10


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the API is away")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, open_directory() as shared:
        home, release = Path(scratch) / "home", shared / "release"
        server = GpuyardUp(home).start()
        try:
            print(json.dumps(run(server, Path(scratch), release, args.outage), indent=2))
        finally:
            release.touch()
            server.stop()


def run(server: GpuyardUp, scratch: Path, release: Path, outage_s: float) -> dict[str, object]:
    env = without_gpuyard_settings()
    team = [sys.executable, "-m", "gpuyard.cli", "token", "create", "--team", "a", "--home", str(server.home)]
    subprocess.run(team, check=True, capture_output=True, env=env, timeout=60)
    proxy = FaultProxy("127.0.0.1", int(server.url.rsplit(":", 1)[1]), name="api").start()
    code = (
        "import os, time\n"
        "for i in range(1, 6): print(f'line {i}', flush=True)\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n"
        f"for i in range(6, {LINES + 1}): print(f'line {{i}}', flush=True)\n"
    )
    spec = scratch / "job.json"
    spec.write_text(
        json.dumps(
            {
                "name": "long-outage",
                "team": "a",
                "image": "python:3.11-slim",
                "command": ["python", "-c", code],
                "resources": {"gpus": 1, "gpu_types": ["cpu"]},
                "retry": {"max_failures": 0},
            }
        )
    )
    via = ["--url", f"http://127.0.0.1:{proxy.port}", "--token", server.admin_token, "--retry-for", "300"]
    cli = [sys.executable, "-m", "gpuyard.cli"]
    direct = GpuyardClient(Endpoint(server.url, server.admin_token))
    submit = subprocess.Popen(
        [*cli, "submit", str(spec), "--wait", "--json", *via],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    job_id = wait_until(
        lambda: next((j["id"] for j in direct.jobs(limit=10) if j["name"] == "long-outage"), None),
        timeout_s=60,
    )
    wait_until(lambda: direct.job(job_id)["state"] == "RUNNING", timeout_s=60)
    logs = subprocess.Popen(
        [*cli, "logs", job_id, "--follow", *via],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    wait_until(
        lambda: (
            "line 5"
            in (server.home / "attempts")
            .joinpath(direct.job(job_id)["attempts"][0]["id"], "rank0.log")
            .read_text()
        ),
        timeout_s=30,
    )
    time.sleep(1.0)  # the follower has printed what was there (a benchmark: no assertion rests on it)
    proxy.set("cut")
    cut_at = time.monotonic()
    release.touch()
    wait_until(lambda: direct.job(job_id)["state"] == "SUCCEEDED", timeout_s=60)
    time.sleep(max(0.0, outage_s - (time.monotonic() - cut_at)))  # the outage's length is the point
    proxy.heal()
    healed_at = time.monotonic()
    submit_out, submit_err = submit.communicate(timeout=120)
    submit_s = time.monotonic() - healed_at
    logs_out, logs_err = logs.communicate(timeout=120)
    logs_s = time.monotonic() - healed_at
    proxy.stop()
    direct.close()
    return {
        "outage_s": round(healed_at - cut_at, 1),
        "submit_wait": {
            "exit": submit.returncode,
            "ended_after_heal_s": round(submit_s, 2),
            "state": json.loads(submit_out)["state"]
            if submit.returncode == 0
            else submit_err.decode()[-500:],
        },
        "logs_follow": {
            "exit": logs.returncode,
            "ended_after_heal_s": round(logs_s, 2),
            "every_line_once": logs_out.splitlines() == [f"line {i}" for i in range(1, LINES + 1)],
            "stderr": logs_err.splitlines(),
        },
    }


if __name__ == "__main__":
    main()
