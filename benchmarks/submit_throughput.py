"""Submit throughput: the real HTTP API against the database's own limit, in one run.

- raw: pgbench, 16 connections, each transaction the two rows a submit commits (job + outbox event);
- API: wrk, 16 connections, POST /v1/jobs with a unique Idempotency-Key per request, against
  `gpuyard api` (2 workers, PostgreSQL, Redis bus) with `gpuyard relay` running beside it.

Needs pgbench (PostgreSQL client) and wrk (Debian package `wrk`; installed when missing and root).
Last line: RESULT submits_per_s=S raw_txn_per_s=T ratio=R p99_ms=L
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import yaml
from harness import free_port, log, recreate_database, servers_parser, wait_ready

ROOT = Path(__file__).resolve().parents[1]
SPEC = {
    **yaml.safe_load((ROOT / "examples" / "flights-delay.yaml").read_text()),
    "team": "bench",
    # production admits images by digest only (docs/security.md); nothing here pulls it
    "image": "python:3.11-slim@sha256:4d440b214e447deddc0a94de23a3d97d28dfafdf125a8b4bb8073381510c9ee2",
}
PGBENCH_SCRIPT = """
BEGIN;
WITH job AS (
  INSERT INTO jobs (id, team, name, spec, spec_hash, idempotency_key, state, priority, gpus, created_by,
                    created_at, updated_at)
  VALUES ('raw-' || gen_random_uuid(), 'bench', 'flights-delay', '{spec}', repeat('0', 64),
          gen_random_uuid()::text, 'PENDING', 1, 1, 'pgbench', now(), now())
  RETURNING id)
INSERT INTO events (type, job_id, data, at)
SELECT 'job.submitted', id, '{{"team": "bench", "gpus": 1, "priority": "normal"}}', now() FROM job;
END;
"""

WRK_SCRIPT = r"""
wrk.method = "POST"
wrk.body = [[{body}]]
local counter = 0
local threads = {{}}
local reported = false
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end
function init(args)
  math.randomseed(os.time() * 1000 + id)
end
function request()
  counter = counter + 1
  local key = "bench-" .. id .. "-" .. counter .. "-" .. math.random(1e9)
  -- wrk.format replaces wrk.headers with the table it is given: pass them all
  return wrk.format(nil, nil, {{["Content-Type"] = "application/json",
                               ["Authorization"] = "Bearer {token}", ["Idempotency-Key"] = key}})
end
function response(status, headers, body)
  if status >= 300 and not reported then
    reported = true
    io.stderr:write("first failed response: " .. status .. " " .. body .. "\n")
  end
end
function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'JSON {{"requests": %d, "seconds": %f, "p50_us": %d, "p99_us": %d, "errors": %d, "non2xx": %d}}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    errors.connect + errors.read + errors.write + errors.timeout, errors.status))
end
"""


def need(binary: str, package: str) -> str:
    found = shutil.which(binary)
    if found is None and os.geteuid() == 0:
        log(f"installing {package} (apt-get) for {binary}")
        subprocess.run(["apt-get", "install", "-y", "-q", package], check=True, capture_output=True)
        found = shutil.which(binary)
    if found is None:
        raise SystemExit(f"{binary} is needed: apt-get install {package}")
    return found


def gpuyard(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], env=env, check=True, capture_output=True, text=True
    ).stdout


def run_pgbench(url: str, clients: int, seconds: int, workdir: Path) -> float:
    script = workdir / "submit.sql"
    script.write_text(PGBENCH_SCRIPT.format(spec=json.dumps(SPEC)))
    result = subprocess.run(
        [
            need("pgbench", "postgresql-client"),
            "-n",
            "-c",
            str(clients),
            "-j",
            "2",
            "-T",
            str(seconds),
            "-f",
            str(script),
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    if not match:
        raise SystemExit(f"pgbench printed no tps:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1))


def main() -> int:
    parser = servers_parser(__doc__)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gpuyard-bench-"))
    url = recreate_database(args.postgres, "gpuyard_bench")
    env = {
        **os.environ,
        "GPUYARD_PROFILE": "production",
        "GPUYARD_LOG_LEVEL": "WARNING",  # the servers' INFO lines would bury the figures
        "GPUYARD_LAUNCHER": "local",  # the submit path does not touch the launcher; no cluster here
        "GPUYARD_DATABASE_URL": url,
        "GPUYARD_REDIS_URL": args.redis,
        "GPUYARD_REDIS_STREAM": "gpuyard:bench",
        "GPUYARD_HOME": str(workdir),
        "GPUYARD_DB_POOL_SIZE": "8",
        "GPUYARD_DEFAULT_QUOTA__GPU_QUOTA": "1000000",
    }
    gpuyard(env, "migrate")  # production processes never migrate: the schema is brought to head first
    token = gpuyard(env, "token", "create", "--team", "bench").strip()

    log(f"[1/3] raw: pgbench, {args.clients} connections, {args.seconds}s")
    raw_tps = run_pgbench(url, args.clients, args.seconds, workdir)
    log(f"      {raw_tps:,.0f} transactions/s")

    port = free_port()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuyard.cli",
                "api",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--workers",
                str(args.workers),
            ],
            env=env,
            start_new_session=True,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", "relay"],
            env=env,
            start_new_session=True,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base)
        lua = workdir / "submit.lua"
        lua.write_text(WRK_SCRIPT.format(body=json.dumps(SPEC), token=token))
        wrk = need("wrk", "wrk")
        log("[2/3] warm-up: 2s")
        subprocess.run(
            [wrk, "-t2", f"-c{args.clients}", "-d2s", "-s", str(lua), f"{base}/v1/jobs"],
            check=True,
            capture_output=True,
        )
        log(f"[3/3] API: wrk, {args.clients} connections, {args.seconds}s, unique Idempotency-Key each")
        result = subprocess.run(
            [wrk, "-t2", f"-c{args.clients}", f"-d{args.seconds}s", "-s", str(lua), f"{base}/v1/jobs"],
            check=True,
            capture_output=True,
            text=True,
        )
        if result.stderr:
            log(result.stderr.strip())
        line = next((ln for ln in result.stdout.splitlines() if ln.startswith("JSON ")), None)
        if line is None:
            raise SystemExit(f"wrk printed no figures:\n{result.stdout}\n{result.stderr}")
        figures = json.loads(line.removeprefix("JSON "))
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)

    with psycopg.connect(url) as conn:
        unpublished = conn.execute("SELECT count(*) FROM events WHERE published_at IS NULL").fetchone()
    submits = figures["requests"] / figures["seconds"]
    errors = figures["errors"] + figures["non2xx"]
    log(
        f"      {submits:,.0f} submits/s, p50 {figures['p50_us'] / 1000:.1f} ms, "
        f"p99 {figures['p99_us'] / 1000:.1f} ms, errors {errors}, events still unpublished after stop: "
        f"{unpublished[0] if unpublished else '?'}"
    )
    if errors:
        log(f"WARNING: {errors} failed requests")
    print(
        f"RESULT submits_per_s={submits:.0f} raw_txn_per_s={raw_tps:.0f} ratio={submits / raw_tps:.3f} "
        f"p99_ms={figures['p99_us'] / 1000:.1f}"
    )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
