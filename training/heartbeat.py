"""Heartbeat client: renews the attempt's lease and carries progress; the answer tells the worker what to do.

Contract with the control plane:

    POST {GPUYARD_API_URL}/v1/attempts/{attempt_id}/heartbeat
    Authorization: Bearer {GPUYARD_ATTEMPT_SECRET}
    {"fencing_token": str, "step": int, "checkpoint": {url, step, saved_at, cost_s, bytes} | null,
     "metrics": {...}, "restore": {step, seconds} (once it restored a checkpoint),
     "checkpoint_stall_s": float (all told),
     "throughput": {step_s, local_batch, accum_steps, global_batch} (once a step was measured)}
    200 -> {"lease_expires_at": iso8601, "lease_seconds": float, "action": "continue" | "checkpoint_and_stop"
            | "stop", "checkpoint_interval_s": float | null}
    401 -> the secret proves no live attempt (the attempt has ended, or it is not this attempt's secret),
           409 -> the fencing token is stale: both treated as "stop" (exit without writing anything).

Network errors and 5xx are retried with backoff while training goes on: if the control plane is really
gone, the lease expires and it requeues the job; the worker does not guess. But once `lease_seconds`
have passed since the last beat that was answered (counted from when it was sent, on the monotonic clock),
the worker's lease may have passed too and a successor may own the job: it writes no checkpoint until a
beat is answered again (`HeartbeatAgent.lease_lapsed`).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from training.checkpoint import CheckpointRecord

log = logging.getLogger(__name__)


class Action(enum.IntEnum):
    """Ordered by severity: when several ranks or beats disagree, the highest wins."""

    CONTINUE = 0
    CHECKPOINT_AND_STOP = 1
    STOP = 2


@dataclass(frozen=True)
class HeartbeatAnswer:
    action: Action
    lease_expires_at: datetime | None = None
    checkpoint_interval_s: float | None = None
    lease_seconds: float | None = None


@dataclass(frozen=True)
class LauncherEnv:
    """What the launcher puts in each worker's environment."""

    api_url: str | None
    attempt_id: str | None
    fencing_token: str | None
    checkpoint_url: str | None
    job_id: str | None
    resume_url: str | None = None  # the job's newest durable checkpoint, as the control plane recorded it
    attempt_secret: str | None = field(default=None, repr=False)  # the proof of the attempt on heartbeats

    @classmethod
    def read(cls, env: Mapping[str, str] = os.environ) -> LauncherEnv:
        return cls(
            env.get("GPUYARD_API_URL") or None,
            env.get("GPUYARD_ATTEMPT_ID") or None,
            env.get("GPUYARD_FENCING_TOKEN") or None,
            env.get("GPUYARD_CHECKPOINT_URL") or None,
            env.get("GPUYARD_JOB_ID") or None,
            env.get("GPUYARD_RESUME_URL") or None,
            env.get("GPUYARD_ATTEMPT_SECRET") or None,
        )

    @property
    def managed(self) -> bool:
        return self.api_url is not None

    def check(self) -> None:
        if self.managed:
            missing = [
                name
                for name, value in (
                    ("GPUYARD_ATTEMPT_ID", self.attempt_id),
                    ("GPUYARD_FENCING_TOKEN", self.fencing_token),
                    ("GPUYARD_ATTEMPT_SECRET", self.attempt_secret),
                )
                if not value
            ]
            if missing:
                raise ValueError(f"GPUYARD_API_URL is set but not {', '.join(missing)}")
        if self.fencing_token is not None and not self.fencing_token.isdigit():
            raise ValueError(f"GPUYARD_FENCING_TOKEN: expected an integer, got {self.fencing_token!r}")


@dataclass(frozen=True)
class Overheads:
    """The attempt's time that made no step, for the platform's useful GPU time (docs/metrics.md)."""

    restored_step: int | None  # the checkpoint step it restored; None: it started afresh
    restore_s: float  # finding and loading that checkpoint
    checkpoint_stall_s: float  # steps paused for checkpoint writes, all told

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"checkpoint_stall_s": round(float(self.checkpoint_stall_s), 6)}
        if self.restored_step is not None:
            body["restore"] = {"step": self.restored_step, "seconds": round(self.restore_s, 6)}
        return body


@dataclass(frozen=True)
class Throughput:
    """How fast the attempt's steps run, at what batch: what an elastic job's sizing reads (the
    scheduler fits each job's step-time model to such reports: gpuyard.domain.elastic)."""

    step_s: float  # one optimizer step (its micro-batches' forward, backward and sync; the update)
    local_batch: int  # each worker's micro-batch
    accum_steps: int  # micro-batches per worker per step
    global_batch: int  # examples per step over all workers

    def to_json(self) -> dict[str, Any]:
        return {
            "throughput": {
                "step_s": round(float(self.step_s), 6),
                "local_batch": self.local_batch,
                "accum_steps": self.accum_steps,
                "global_batch": self.global_batch,
            }
        }


class HeartbeatError(RuntimeError):
    """The control plane answered something outside the contract."""


class HeartbeatClient:
    """One heartbeat = one POST, retried with exponential backoff on network errors and 5xx."""

    def __init__(
        self,
        api_url: str,
        attempt_id: str,
        fencing_token: str,
        attempt_secret: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/v1/attempts/{attempt_id}/heartbeat"
        self.fencing_token = fencing_token
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self._http = httpx.Client(
            timeout=timeout_s, transport=transport, headers={"Authorization": f"Bearer {attempt_secret}"}
        )

    def close(self) -> None:
        self._http.close()

    def beat(
        self,
        step: int,
        checkpoint: CheckpointRecord | None,
        metrics: Mapping[str, float] | None = None,
        overheads: Overheads | None = None,
        throughput: Throughput | None = None,
    ) -> HeartbeatAnswer | None:
        """Send one heartbeat. None when the control plane could not be reached after the retries."""
        body: dict[str, Any] = {
            "fencing_token": self.fencing_token,
            "step": step,
            "checkpoint": checkpoint.to_json() if checkpoint else None,
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            **(overheads.to_json() if overheads is not None else {}),
            **(throughput.to_json() if throughput is not None else {}),
        }
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                response = self._http.post(self.url, json=body)
            except httpx.HTTPError as exc:
                log.warning("heartbeat %d/%d failed: %s", attempt + 1, self.retries + 1, exc)
            else:
                if response.status_code == 401:
                    log.error("heartbeat refused: the attempt has ended, or the secret is not its own")
                    return HeartbeatAnswer(Action.STOP)
                if response.status_code == 409:
                    log.error("heartbeat refused: stale fencing token (%s)", response.text[:200])
                    return HeartbeatAnswer(Action.STOP)
                if response.status_code == 200:
                    return parse_answer(response.json())
                if response.status_code < 500:
                    raise HeartbeatError(
                        f"heartbeat: expected 200, 401 or 409, "
                        f"got {response.status_code}: {response.text[:200]}"
                    )
                log.warning("heartbeat %d/%d: HTTP %d", attempt + 1, self.retries + 1, response.status_code)
            if attempt < self.retries:
                self.sleep(delay)
                delay *= 2
        return None


def parse_answer(raw: Any) -> HeartbeatAnswer:
    if not isinstance(raw, dict) or "action" not in raw:
        raise HeartbeatError(f"heartbeat answer: expected an object with 'action', got {raw!r}")
    try:
        action = Action[str(raw["action"]).upper()]
    except KeyError:
        raise HeartbeatError(
            f"heartbeat answer: action expected continue, checkpoint_and_stop or stop, got {raw['action']!r}"
        ) from None
    expires = raw.get("lease_expires_at")
    interval = raw.get("checkpoint_interval_s")
    lease = raw.get("lease_seconds")
    return HeartbeatAnswer(
        action,
        datetime.fromisoformat(expires) if expires else None,
        float(interval) if interval is not None else None,
        float(lease) if lease is not None else None,
    )


class HeartbeatAgent:
    """Rank 0's background thread: beats every `interval_s` with the newest progress, remembers the most
    severe action heard and the latest checkpoint interval. The training loop polls it between steps."""

    def __init__(
        self,
        client: HeartbeatClient,
        interval_s: float,
        progress: Callable[[], tuple[int, CheckpointRecord | None, dict[str, float]]],
        monotonic: Callable[[], float] = time.monotonic,
        recorded: Callable[[str], None] = lambda url: None,
        overheads: Callable[[], Overheads] | None = None,
        throughput: Callable[[], Throughput | None] | None = None,
    ) -> None:
        """`recorded`: told the URL of each checkpoint a beat carried that the control plane answered,
        which it has recorded as the job's newest. `overheads`: what each beat reports of the restore
        and the checkpoint stalls. `throughput`: what it reports of its steps' speed and batch (None:
        nothing measured yet)."""
        self.client = client
        self.overheads = overheads
        self.throughput = throughput
        self.recorded = recorded
        self.monotonic = monotonic
        self._lease_until: float | None = None  # monotonic time the last answered beat's lease lasts to
        self.interval_s = interval_s
        self.progress = progress
        self._action = Action.CONTINUE
        self._interval: float | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.beats = 0

    def start(self) -> HeartbeatAgent:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.beat_now()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def beat_now(self) -> HeartbeatAnswer | None:
        step, checkpoint, metrics = self.progress()
        sent = self.monotonic()
        try:
            answer = self.client.beat(
                step,
                checkpoint,
                metrics,
                self.overheads() if self.overheads else None,
                self.throughput() if self.throughput else None,
            )
        except HeartbeatError as exc:
            log.error("%s", exc)
            return None
        self.beats += 1
        if answer is not None:
            if checkpoint is not None and answer.action != Action.STOP:
                self.recorded(checkpoint.url)
            with self._lock:
                self._action = max(self._action, answer.action)
                if answer.checkpoint_interval_s is not None:
                    self._interval = answer.checkpoint_interval_s
                if answer.lease_seconds is not None:
                    self._lease_until = sent + answer.lease_seconds
        return answer

    @property
    def lease_lapsed(self) -> bool:
        """No beat answered within the lease period: stop writing (a successor may own the job)."""
        with self._lock:
            return self._lease_until is not None and self.monotonic() > self._lease_until

    @property
    def action(self) -> Action:
        with self._lock:
            return self._action

    @property
    def checkpoint_interval_s(self) -> float | None:
        with self._lock:
            return self._interval

    def stop(self, final_beat: bool = True) -> None:
        """Stop the thread; with `final_beat`, report the final progress (e.g. the preemption checkpoint)."""
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=self.client.timeout_s * (self.client.retries + 1) + 1.0)
        if final_beat:
            self.beat_now()
        self.client.close()
