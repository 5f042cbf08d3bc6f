"""How a training task's log tells a job's story: a line per event, from the events themselves.

A `Story` takes one job's events in order (the JSON of `/v1/events`) and says each attempt, where
it was placed, its durable checkpoints (each step once: heartbeats repeat the newest), stop notices,
preemptions, the step an attempt resumed from, the progress lost, and the final state, all from the
events (an attempt's ending carries the step it reached and its last checkpoint's), so a follower of
a thousand jobs reads nothing but the events. Only an interruption recorded before endings carried
their steps needs the attempt as the API shows it (`needs_attempt`). The trigger and the operator's
synchronous path tell jobs with the same Story, so a job reads the same whichever way it was followed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TERMINAL_JOB_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})
INTERRUPTIONS = frozenset({"attempt.preempted", "attempt.lost", "attempt.failed", "attempt.cancelled"})
QUIET = frozenset({"attempt.launching", "job.running"})  # said better by the events around them
PLACED = re.compile(r"attempt (\d+) on (.+)")  # the reason of job.scheduled (store/attempts.py)


def lost_steps(attempt: Mapping[str, Any]) -> int | None:
    """Steps done since the attempt's last durable checkpoint: the work its end threw away."""
    step = attempt.get("step")
    if step is None:
        return None
    return max(0, int(step) - int(attempt.get("checkpoint_step") or 0))


class Story:
    """One job's events, told in order; it remembers what the next lines need."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}  # attempt id -> its number
        self.checkpoint: int | None = None  # the newest durable checkpoint told: where a next attempt resumes
        self.attempts = 0
        self.interrupted = 0
        self.lost = 0

    def needs_attempt(self, event: Mapping[str, Any]) -> bool:
        """Whether telling `event` needs its attempt from the API (`GET /v1/jobs/{id}`): an
        interruption recorded before endings carried their steps."""
        return event["type"] in INTERRUPTIONS and "step" not in (event.get("data") or {})

    def recall(self, event: Mapping[str, Any]) -> None:
        """Take in an event told before (by an earlier trigger) without telling it again."""
        self.tell(event)

    def tell(self, event: Mapping[str, Any], attempt: Mapping[str, Any] | None = None) -> str | None:
        """The line for `event`, or None when it adds nothing. `attempt` is its attempt as the API
        shows it, for events that `needs_attempt`."""
        kind, data = event["type"], event.get("data") or {}
        why = f": {data['reason']}" if data.get("reason") else ""
        label = self._label(event.get("attempt_id"))
        if kind == "job.scheduled":
            placed = PLACED.match(data.get("reason") or "")
            self.attempts += 1
            if placed and event.get("attempt_id"):
                self.numbers[event["attempt_id"]] = int(placed.group(1))
            return f"attempt {placed.group(1)} placed on {placed.group(2)}" if placed else f"placed{why}"
        if kind in QUIET:
            return None
        if kind == "job.submitted":
            gpus, priority = data.get("gpus", "?"), data.get("priority", "?")
            return f"submitted: {gpus} GPU(s), priority {priority}, team {data.get('team', '?')}"
        if kind == "attempt.running":
            resumes = (
                f"resuming from the checkpoint at step {self.checkpoint}"
                if self.checkpoint is not None
                else "from step 0"
            )
            return f"{label} running, {resumes}"
        if kind == "attempt.checkpointed":
            step = data.get("step")
            if step == self.checkpoint:
                return None
            self.checkpoint = step
            return f"{label} checkpoint at step {step}"
        if kind == "attempt.stop_requested":
            return f"{label} asked to checkpoint and stop ({data.get('kind', 'stop')}): {data.get('why', '')}"
        if kind in INTERRUPTIONS:
            self.interrupted += 1
            state = kind.split(".", 1)[1].upper()
            if "step" in data:  # the ending carries how far the attempt got
                attempt = data
            if attempt is None or attempt.get("step") is None:
                return f"{label} {state}{why}"
            lost = lost_steps(attempt) or 0
            self.lost += lost
            saved = attempt.get("checkpoint_step")
            if saved is not None:
                self.checkpoint = max(saved, self.checkpoint or 0)
            return (
                f"{label} {state} at step {attempt['step']}; last checkpoint step "
                f"{saved if saved is not None else 'none'}, {lost} step(s) lost{why}"
            )
        if kind.startswith("attempt."):
            return f"{label} {kind.split('.', 1)[1].upper()}{why}"
        if kind == "job.pending":
            return f"back in the queue{why}"
        if kind == "job.cancel_requested":
            return f"cancel requested by {data.get('by', '?')}"
        if kind == "job.checkpoint_moved":
            return f"checkpoint copied to site {data.get('site', '?')}: {data.get('to', '')}"
        if kind in TERMINAL_JOB_EVENTS:
            return f"job {kind.split('.', 1)[1].upper()}{why}"
        return f"{kind}{why}"

    def summary(self, job_id: str, state: str, reason: str | None) -> str:
        """One line over the whole job: its state, attempts and the progress lost to interruptions."""
        return (
            f"job {job_id} {state} after {self.attempts} attempt(s), {self.interrupted} interrupted, "
            f"{self.lost} step(s) lost" + (f": {reason}" if reason else "")
        )

    def _label(self, attempt_id: str | None) -> str:
        number = self.numbers.get(attempt_id or "")
        return f"attempt {number}" if number is not None else "attempt"


def attempt_of(job: Mapping[str, Any] | None, attempt_id: str | None) -> Mapping[str, Any] | None:
    """The attempt `attempt_id` of a job as `GET /v1/jobs/{id}` shows it."""
    return next((a for a in (job or {}).get("attempts") or [] if a["id"] == attempt_id), None)


def tell_batch(story: Story, batch: list[dict[str, Any]], job: Mapping[str, Any] | None) -> list[str]:
    """The lines of a batch of events (`job`: read after the batch when one of them needs it)."""
    lines = []
    for event in batch:
        line = story.tell(event, attempt_of(job, event.get("attempt_id")))
        if line:
            lines.append(f"gpuyard job {event['job_id']} #{event['seq']}: {line}")
    return lines
