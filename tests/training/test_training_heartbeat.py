"""Heartbeat client against a real HTTP server implementing the control plane's contract."""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime

import pytest
from heartbeat_plane import ControlPlane, lease

from training.checkpoint import CheckpointRecord
from training.heartbeat import (
    Action,
    HeartbeatAgent,
    HeartbeatClient,
    HeartbeatError,
    LauncherEnv,
    Overheads,
    Throughput,
)


def client(
    plane: ControlPlane, token: str | None = None, retries: int = 2, secret: str | None = None
) -> HeartbeatClient:
    return HeartbeatClient(
        plane.url,
        plane.attempt_id,
        token or plane.fencing_token,
        plane.attempt_secret if secret is None else secret,
        retries=retries,
        backoff_s=0.01,
        timeout_s=2.0,
    )


def test_heartbeat_carries_progress_and_reads_the_answer() -> None:
    record = CheckpointRecord(
        "file:///ckpt/step-000000010", 10, datetime(2026, 11, 30, tzinfo=UTC), 1.5, 8363
    )
    with ControlPlane(lambda n, body: lease("continue", 42.0)) as plane:
        answer = client(plane).beat(12, record, {"train_loss": 0.5})
    assert answer is not None and answer.action == Action.CONTINUE
    assert answer.checkpoint_interval_s == 42.0 and answer.lease_expires_at is not None
    assert plane.beats == [
        {
            "fencing_token": "41",
            "step": 12,
            "metrics": {"train_loss": 0.5},
            "checkpoint": {
                "url": "file:///ckpt/step-000000010",
                "step": 10,
                "saved_at": "2026-11-30T00:00:00+00:00",
                "cost_s": 1.5,
                "bytes": 8363,
            },
        }
    ]


def test_the_agent_reports_the_restore_and_the_checkpoint_stalls() -> None:
    """What the platform's useful GPU time needs (docs/metrics.md): a resumed attempt reports the step
    it restored and how long that took; every attempt its checkpoint stalls so far."""
    stalls = [0.0]
    with ControlPlane(lambda n, body: lease("continue")) as plane:
        resumed = HeartbeatAgent(
            client(plane), 3600, lambda: (40, None, {}), overheads=lambda: Overheads(40, 2.5, stalls[0])
        )
        resumed.beat_now()
        stalls[0] = 1.25
        resumed.beat_now()
        fresh = HeartbeatAgent(
            client(plane), 3600, lambda: (3, None, {}), overheads=lambda: Overheads(None, 0.1, 0)
        )
        fresh.beat_now()
        for agent in (resumed, fresh):
            agent.client.close()
    first, second, third = plane.beats
    assert first["restore"] == {"step": 40, "seconds": 2.5} and first["checkpoint_stall_s"] == 0.0
    assert second["restore"] == first["restore"] and second["checkpoint_stall_s"] == 1.25
    assert "restore" not in third and third["checkpoint_stall_s"] == 0  # it started afresh


def test_the_agent_reports_the_measured_step_time_and_batch_once_a_step_was_measured() -> None:
    """What an elastic job's sizing reads: seconds per step at the batch the workers run; a beat sent
    before the first step was measured carries none (the API takes it as optional)."""
    measured: list[Throughput | None] = [None]
    with ControlPlane(lambda n, body: lease("continue")) as plane:
        agent = HeartbeatAgent(client(plane), 3600, lambda: (0, None, {}), throughput=lambda: measured[0])
        agent.beat_now()
        measured[0] = Throughput(0.123456789, 8, 2, 32)
        agent.beat_now()
        agent.client.close()
    first, second = plane.beats
    assert "throughput" not in first
    expected = {"step_s": 0.123457, "local_batch": 8, "accum_steps": 2, "global_batch": 32}
    assert second["throughput"] == expected


def test_checkpoint_and_stop_is_passed_on() -> None:
    with ControlPlane(lambda n, body: lease("checkpoint_and_stop")) as plane:
        answer = client(plane).beat(3, None)
    assert answer is not None and answer.action == Action.CHECKPOINT_AND_STOP
    assert plane.beats[0]["checkpoint"] is None


def test_stale_fencing_token_means_stop() -> None:
    with ControlPlane(lambda n, body: lease()) as plane:
        answer = client(plane, token="40").beat(3, None)
    assert answer is not None and answer.action == Action.STOP
    assert plane.beats == []


def test_a_refused_secret_means_stop() -> None:
    """401: the attempt has ended (its secret died with it) or the secret is not its own. Either way
    nothing of this worker may be written any more."""
    with ControlPlane(lambda n, body: lease()) as plane:
        answer = client(plane, secret="not-the-attempt-s").beat(3, None)
    assert answer is not None and answer.action == Action.STOP
    assert plane.beats == []


def test_server_errors_are_retried_then_answered() -> None:
    with ControlPlane(lambda n, body: (503, {}) if n < 3 else lease("continue")) as plane:
        answer = client(plane, retries=3).beat(1, None)
    assert answer is not None and answer.action == Action.CONTINUE
    assert len(plane.beats) == 3


def test_unreachable_control_plane_gives_no_answer_after_retries() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    c = HeartbeatClient(
        f"http://127.0.0.1:{port}", "a", "t", "s", retries=3, backoff_s=0.5, sleep=sleeps.append
    )
    assert c.beat(1, None) is None
    assert sleeps == [0.5, 1.0, 2.0]  # exponential backoff between attempts


def test_answer_outside_the_contract_is_an_error() -> None:
    with ControlPlane(lambda n, body: (200, {"action": "explode"})) as plane, pytest.raises(HeartbeatError):
        client(plane).beat(1, None)


def test_agent_keeps_the_most_severe_action_and_the_latest_interval() -> None:
    script = {1: lease("continue", 30.0), 2: lease("checkpoint_and_stop", 20.0)}
    with ControlPlane(lambda n, body: script.get(n, lease("continue"))) as plane:
        agent = HeartbeatAgent(client(plane), 0.05, lambda: (5, None, {})).start()
        deadline = time.monotonic() + 10
        while len(plane.beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        agent.stop(final_beat=True)
    assert agent.action == Action.CHECKPOINT_AND_STOP  # a later "continue" does not cancel it
    assert agent.checkpoint_interval_s == 20.0


def test_launcher_env_standalone_and_managed() -> None:
    assert not LauncherEnv.read({}).managed
    env = LauncherEnv.read({"GPUYARD_API_URL": "http://x", "GPUYARD_ATTEMPT_ID": "a"})
    assert env.managed
    with pytest.raises(ValueError, match=r"set but not GPUYARD_FENCING_TOKEN, GPUYARD_ATTEMPT_SECRET$"):
        env.check()
    LauncherEnv.read(
        {
            "GPUYARD_API_URL": "http://x",
            "GPUYARD_ATTEMPT_ID": "a",
            "GPUYARD_FENCING_TOKEN": "7",
            "GPUYARD_ATTEMPT_SECRET": "s",
        }
    ).check()


def test_the_agent_knows_when_no_beat_was_answered_within_the_lease() -> None:
    """The worker's own rule: lease_seconds after the last answered beat was sent, stop writing."""
    now = [100.0]
    with ControlPlane(lambda n, body: (200, {**lease("continue")[1], "lease_seconds": 10.0})) as plane:
        agent = HeartbeatAgent(client(plane), 3600, lambda: (1, None, {}), monotonic=lambda: now[0])
        assert not agent.lease_lapsed  # no answer yet: nothing known, nothing to stop
        assert agent.beat_now() is not None
        now[0] = 109.0
        assert not agent.lease_lapsed
        now[0] = 110.5
        assert agent.lease_lapsed
        agent.beat_now()  # answered again: writing may go on
        assert not agent.lease_lapsed
        agent.client.close()


def test_the_agent_tells_which_checkpoints_the_control_plane_recorded() -> None:
    """Only an answered beat records its checkpoint: not one left unanswered (the API away), nor one
    refused (a stale token), nor a beat that carried none."""
    record = CheckpointRecord("file:///ckpt/step-000000010-t41", 10, datetime(2026, 12, 5, tzinfo=UTC), 0.5)
    recorded: list[str] = []
    answers = iter([(503, {}), (503, {}), (503, {}), lease("continue"), lease("continue")])
    with ControlPlane(lambda n, body: next(answers)) as plane:
        carried = [record, record, None]
        agent = HeartbeatAgent(
            client(plane, retries=2), 3600, lambda: (10, carried.pop(0), {}), recorded=recorded.append
        )
        assert agent.beat_now() is None and recorded == []  # three 503s: no answer
        assert agent.beat_now() is not None and recorded == [record.url]
        assert agent.beat_now() is not None and recorded == [record.url]  # carried none
        agent.client.close()
    with ControlPlane(lambda n, body: lease()) as plane:
        stale = HeartbeatAgent(
            client(plane, token="40"), 3600, lambda: (10, record, {}), recorded=recorded.append
        )
        assert stale.beat_now() is not None and recorded == [record.url]  # refused: nothing new
        stale.client.close()
