"""A stand-in for the control plane's heartbeat endpoint: a real HTTP server on 127.0.0.1 that checks
what a worker sends (path, attempt secret, fencing token) and answers as a test scripts it. Used by the
training runtime's tests and the fault suite's real-runtime worker test."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ControlPlane:
    """A real HTTP server on 127.0.0.1 implementing the heartbeat contract; `answer(n, body)` scripts it."""

    def __init__(
        self,
        answer: Callable[[int, dict[str, Any]], tuple[int, dict[str, Any]]],
        attempt_id: str = "att-1",
        fencing_token: str = "41",  # the launcher hands workers an integer
        attempt_secret: str = "s3cret-of-att-1",
    ) -> None:
        self.beats: list[dict[str, Any]] = []
        self.attempt_id = attempt_id
        self.fencing_token = fencing_token
        self.attempt_secret = attempt_secret
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                expected = f"/v1/attempts/{plane.attempt_id}/heartbeat"
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != expected:
                    status, payload = 404, {"detail": f"expected {expected}"}
                elif self.headers.get("Authorization") != f"Bearer {plane.attempt_secret}":
                    status, payload = 401, {"detail": "not this attempt's secret"}
                elif body.get("fencing_token") != plane.fencing_token:
                    status, payload = 409, {"detail": "stale fencing token"}
                else:
                    plane.beats.append(body)
                    status, payload = answer(len(plane.beats), body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ControlPlane:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self, checkpoint_url: str | None = None, job_id: str = "job-1") -> dict[str, str]:
        env = {
            "GPUYARD_API_URL": self.url,
            "GPUYARD_ATTEMPT_ID": self.attempt_id,
            "GPUYARD_FENCING_TOKEN": self.fencing_token,
            "GPUYARD_ATTEMPT_SECRET": self.attempt_secret,
            "GPUYARD_JOB_ID": job_id,
        }
        if checkpoint_url:
            env["GPUYARD_CHECKPOINT_URL"] = checkpoint_url
        return env


def lease(action: str = "continue", interval: float | None = None) -> tuple[int, dict[str, Any]]:
    return 200, {
        "lease_expires_at": "2026-11-30T12:00:00+00:00",
        "action": action,
        "checkpoint_interval_s": interval,
    }
