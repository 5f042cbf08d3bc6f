"""/metrics, /healthz and /readyz for a process that serves no HTTP API of its own (scheduler, relay).

A small threaded HTTP server on its own port (settings: `scheduler_probe_port`, `relay_probe_port`).
`/healthz` answers 200 while the process's loop goes round (its `*_loop_timestamp_seconds` gauge is
newer than `stall_s`): a loop stuck for longer gets the pod restarted. `/readyz` answers 200 when
`ready()` finds nothing wrong (the store answers), else 503 with the problem. `/metrics` is the scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import Engine, text

from gpuyard import metrics


def loop_problem(gauge: str, stall_s: float, clock: Callable[[], float] = time.time) -> str | None:
    """None while the gauge named `gauge` (set each time the loop goes round) is newer than
    `stall_s`, else what is wrong."""
    last = metrics.registry.get_sample_value(gauge) or 0.0
    if last == 0:
        return "the loop has not gone round yet"
    if clock() - last > stall_s:
        return f"the loop has not gone round for {clock() - last:.0f}s (limit {stall_s:g}s)"
    return None


def store_problem(engine: Engine) -> str | None:
    """None when the store answers a query, else the error's first line."""
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:
        return f"database: {str(error).splitlines()[0]}"
    return None


class ProbeServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        alive: Callable[[], str | None],
        ready: Callable[[], str | None],
    ):
        probes = {"/healthz": alive, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, metrics.latest(), CONTENT_TYPE_LATEST)
                elif path in probes:
                    problem = probes[path]()
                    self._answer(503 if problem else 200, (problem or "ok").encode() + b"\n")
                else:
                    self._answer(404, b"not found: /metrics, /healthz or /readyz\n")

            def _answer(self, status: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no line
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="probes", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ProbeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
