"""The stream of jobs a campaign submits, and the client that submits and cancels them.

`plan` is pure (a seed gives the same jobs at the same moments): a mix of kinds (workers that
checkpoint and resume, long ones that get preempted, two-rank gangs of high priority that preempt
them, jobs that fail on their own, plain commands that never heartbeat), some cancelled a while
after they were submitted. The client behaves as a careful one does: an answer it did not get
(a timeout, a reset, a 5xx) is retried with the same Idempotency-Key until it gets a definite one.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .history import CancelRequest, Submission

TEAM = "faults"
IMAGE = "docker.io/library/python@sha256:" + "0" * 64  # production admits images pinned by digest only
WORKER = Path(__file__).parent / "worker.py"
RUNTIME_WORKER = Path(__file__).parent / "runtime_worker.py"
RUNTIME_CONFIG = "runtime.yaml"  # in the run directory, beside its data (`write_runtime_config`)
RETRY_S = (0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Plan:
    key: str  # the Idempotency-Key
    kind: str
    at_s: float  # seconds into the campaign
    spec: dict[str, Any]
    cancel_after_s: float | None = None


def _worker(
    steps: int, step_s: float, save_every: int, lease_s: float, fail_at: int | None = None
) -> list[str]:
    command = [sys.executable, str(WORKER), "--steps", str(steps), "--step-seconds", str(step_s)]
    command += ["--save-every", str(save_every), "--lease-seconds", str(lease_s)]
    return command + (["--fail-at", str(fail_at), "--exit-code", "3"] if fail_at else [])


def write_runtime_config(run: Path) -> Path:
    """The tiny model the real runtime trains in a campaign: a 4-feature MLP of one hidden layer of 8
    on 200 synthetic rows, checkpointing every 5 steps, heartbeating every second, MLflow off."""
    from training.data import write_synthetic

    data = run / "runtime.parquet"
    write_synthetic(str(data), rows=200, features=4, seed=3)
    config = {
        "seed": 7,
        "data": {"path": str(data), "label_column": "is_delayed"},
        "model": {"hidden": [8], "dropout": 0.0},
        "train": {"max_steps": 20, "global_batch_size": 16, "lr": 0.01, "step_sleep_s": 0.15},
        "parallel": {"strategy": "ddp", "backend": "gloo"},
        "checkpoint": {"interval_steps": 5, "keep_last": 2},
        "heartbeat": {"interval_s": 1.0, "timeout_s": 3.0},
        "mlflow": {"enabled": False},
    }
    path = run / RUNTIME_CONFIG
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _runtime(run: Path, steps: int) -> list[str]:
    config = str(run / RUNTIME_CONFIG)
    return [sys.executable, str(RUNTIME_WORKER), "--config", config, "--set", f"train.max_steps={steps}"]


def _part(
    command: list[str], gpus: int, priority: str, preemptible: bool, max_failures: int, **rest: Any
) -> dict[str, Any]:
    return {
        "command": command,
        "gpus": gpus,
        "priority": priority,
        "preemptible": preemptible,
        "max_failures": max_failures,
        **rest,
    }


def _kind(rng: random.Random, kind: str, lease_s: float, run: Path) -> dict[str, Any]:
    """The part of a spec that makes the kind: command, GPUs, priority, preemptible, retry budget.
    (Arguments are drawn left to right: a seed replays the same workload.)"""
    if kind == "resumer":
        command = _worker(rng.randint(15, 40), 0.15, 5, lease_s)
        return _part(command, 1, rng.choice(["low", "normal"]), rng.random() < 0.7, 2)
    if kind == "runtime":  # the real training runtime (runtime_worker.py): one rank, or a gang of two
        command = _runtime(run, rng.randint(10, 25))
        gpus = 2 if rng.random() < 0.25 else 1
        return _part(command, gpus, rng.choice(["low", "normal"]), rng.random() < 0.7, 2)
    if kind == "long":
        return _part(_worker(rng.randint(60, 90), 0.15, 8, lease_s), 1, "low", True, 2)
    if kind == "gang":
        return _part(_worker(rng.randint(15, 30), 0.15, 5, lease_s), 2, "high", False, 2)
    if kind == "failing":
        command = _worker(30, 0.15, 3, lease_s, fail_at=rng.randint(4, 9))
        return _part(command, 1, "normal", rng.random() < 0.5, 1)
    assert kind == "plain"
    return _part(["sleep", str(rng.randint(2, 4))], 1, "normal", False, 1, checkpoint=False)


# Relative frequency. The real runtime costs about 4 s of CPU to start (torch) where the light worker
# costs 0.1 s: a campaign on two shared cores runs a few of it among many light ones.
KINDS = {"resumer": 4, "runtime": 1.5, "long": 1, "gang": 1, "failing": 1, "plain": 1}


def writes_journal(job_name: str) -> bool:
    """Every kind runs the suite's worker, which journals what it does, but plain commands."""
    return not job_name.startswith("plain-")


def plan(
    seed: int,
    *,
    duration_s: float,
    rate_per_s: float,
    run: Path,
    lease_s: float,
    store: str | None = None,
    min_jobs: int = 0,
) -> list[Plan]:
    """Jobs arriving at `rate_per_s` (Poisson) over `duration_s`; a draw of fewer than `min_jobs` is
    topped up with jobs at random times of the window (a draw with enough is as without it).
    `store`: the checkpoint store (the platform's `checkpoint_store`); the run's folder by default."""
    rng = random.Random(f"workload-{seed}")
    store = store or (run / "checkpoints").as_uri()
    plans: list[Plan] = []

    def arrivals() -> Iterator[float]:  # drawn between the jobs, as a seed always drew them
        at, count = 0.0, 0
        while (at := at + rng.expovariate(rate_per_s)) < duration_s:
            count += 1
            yield at
        for _ in range(min_jobs - count):
            yield rng.uniform(0, duration_s)

    for at in arrivals():
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        key = f"{kind}-{len(plans)}-{uuid.UUID(int=rng.getrandbits(128)).hex[:8]}"
        made = _kind(rng, kind, lease_s, run)
        spec: dict[str, Any] = {
            "name": key,
            "team": TEAM,
            "image": IMAGE,
            "command": made["command"],
            "env": {
                "FAULTS_JOURNAL": str(run / "journal.sock"),
                "FAULTS_DIR": str(run),
                "FAULTS_RUN": run.name,
            },
            "resources": {"gpus": made["gpus"], "gpu_types": ["cpu"], "nodes": 1},
            "priority": made["priority"],
            "preemptible": made["preemptible"],
            "retry": {"max_failures": made["max_failures"], "backoff": "1s"},
        }
        if made.get("checkpoint", True):
            # Under the team's root in the cluster's checkpoint store (`<store>/<team>`).
            spec["checkpoint"] = {"url": f"{store}/{TEAM}/{key}", "interval": "30s"}
        cancel = rng.uniform(0.5, 8.0) if rng.random() < 0.12 else None
        plans.append(Plan(key, kind, at, spec, cancel))
    return sorted(plans, key=lambda p: p.at_s)


class Client:
    """Submits the plans on time and cancels those that say so; records every definite answer."""

    def __init__(
        self, api_url: str, token: str, plans: list[Plan], *, give_up_at: float, stop: threading.Event
    ):
        """`stop`: the campaign is being undone; a call still retrying gives up at once (else an
        interrupted run waited for `give_up_at` with its servers gone)."""
        self.api_url, self.plans, self.give_up_at, self.stop = api_url, plans, give_up_at, stop
        self.headers = {"Authorization": f"Bearer {token}"}
        self.submissions = {p.key: Submission(p.key, p.kind) for p in plans}
        self.cancels: list[CancelRequest] = []
        self.rejected: list[str] = []  # definite refusals of a valid spec: a bug of the platform or ours
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="client")
        self._lock = threading.Lock()

    def run(self, started: float) -> None:
        """Submit each plan at its moment (in this thread's time); returns when all are handed out."""
        for planned in self.plans:
            if self.stop.wait(max(0.0, started + planned.at_s - time.monotonic())):
                return
            self._pool.submit(self._submit, planned)

    def wait(self) -> None:
        self._pool.shutdown(wait=True)

    def _call(self, method: str, path: str, headers: dict[str, str], **kwargs: Any) -> httpx.Response | None:
        """A definite answer, retried through timeouts, resets and 5xx; None once the suite gives up."""
        for delay in itertools.chain(RETRY_S, itertools.repeat(RETRY_S[-1])):
            try:
                response = httpx.request(
                    method, self.api_url + path, headers={**self.headers, **headers}, timeout=5, **kwargs
                )
                if response.status_code < 500:
                    return response
            except httpx.HTTPError:
                pass
            if time.monotonic() + delay > self.give_up_at or self.stop.wait(delay):
                return None
        return None  # unreachable: the delays never end

    def _submit(self, planned: Plan) -> None:
        submission = self.submissions[planned.key]
        response = self._call("POST", "/v1/jobs", {"Idempotency-Key": planned.key}, json=planned.spec)
        if response is None:
            return
        if response.status_code not in (200, 201):
            with self._lock:
                self.rejected.append(f"{planned.key}: HTTP {response.status_code} {response.text[:300]}")
            return
        job_id = response.json()["id"]
        with self._lock:
            submission.ids.add(job_id)
            submission.job_id, submission.accepted = job_id, True
        if planned.cancel_after_s is not None:
            time.sleep(planned.cancel_after_s)
            self._cancel(job_id)

    def _cancel(self, job_id: str) -> None:
        request = CancelRequest(job_id)
        with self._lock:
            self.cancels.append(request)
        response = self._call("POST", f"/v1/jobs/{job_id}/cancel", {})
        if response is not None:
            request.status = response.status_code
            body = response.json()
            request.state = body.get("state")
