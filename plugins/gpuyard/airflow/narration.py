"""How a training task's log tells a job's story: one line per event, from the event and the job.

Functions over the API's JSON (an event of `/v1/events`, the job of `/v1/jobs/{id}`): each attempt,
where it was placed, checkpoints, stop notices, preemptions, the step an attempt resumed from, the
progress lost, and the final state. A `Story` tells one job's events in order and says each durable
checkpoint once (heartbeats repeat the newest one). The trigger and the operator's synchronous path
both tell jobs this way, so a job reads the same whichever way it was followed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TERMINAL_JOB_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})
# Events after which the job's attempts must be read again to tell them (placement, steps).
NEEDS_ATTEMPTS = frozenset(
    {
        "job.scheduled",
        "attempt.running",
        "attempt.succeeded",
        "attempt.failed",
        "attempt.preempted",
        "attempt.lost",
        "attempt.cancelled",
    }
)
QUIET = frozenset({"attempt.launching", "job.running"})  # said better by the events around them


def placement_text(placement: Mapping[str, Any]) -> str:
    """`node-a GPUs 0,1 + node-b GPUs 0,1 (domain d1, site s1)` from an attempt's placement."""
    nodes = " + ".join(
        f"{n['node']} GPUs {','.join(str(g) for g in n['gpus'])}" for n in placement.get("nodes") or []
    )
    where = ", ".join(f"{k} {placement[k]}" for k in ("domain", "site") if placement.get(k))
    return f"{nodes or 'no node'}" + (f" ({where})" if where else "")


def resumed_from(attempts: Sequence[Mapping[str, Any]], number: int) -> int | None:
    """The step attempt `number` resumed from: the newest checkpoint of the attempts before it."""
    steps = [
        a["checkpoint_step"]
        for a in attempts
        if a["number"] < number and a.get("checkpoint_step") is not None
    ]
    return max(steps) if steps else None


def lost_steps(attempt: Mapping[str, Any]) -> int | None:
    """Steps done since the attempt's last durable checkpoint: the work its end threw away."""
    step = attempt.get("step")
    if step is None:
        return None
    return max(0, int(step) - int(attempt.get("checkpoint_step") or 0))


def describe(event: Mapping[str, Any], job: Mapping[str, Any] | None) -> str | None:
    """The log line for `event`, or None for events that add nothing. `job` is the job as read after
    the event (with its attempts) when the event is in NEEDS_ATTEMPTS, else may be None."""
    kind, data = event["type"], event.get("data") or {}
    attempts = (job or {}).get("attempts") or []
    attempt = next((a for a in attempts if a["id"] == event.get("attempt_id")), None)
    label = f"attempt {attempt['number']}" if attempt else "attempt"
    why = f": {data['reason']}" if data.get("reason") else ""
    if kind in QUIET:
        return None
    if kind == "job.submitted":
        gpus, priority = data.get("gpus", "?"), data.get("priority", "?")
        return f"submitted: {gpus} GPU(s), priority {priority}, team {data.get('team', '?')}"
    if kind == "job.scheduled":
        return f"{label} placed on {placement_text(attempt['placement']) if attempt else 'a node'}"
    if kind == "attempt.running":
        start = resumed_from(attempts, attempt["number"]) if attempt else None
        resumes = f", resuming from the checkpoint at step {start}" if start is not None else ", from step 0"
        return f"{label} running{resumes}"
    if kind == "attempt.checkpointed":
        return f"{label} checkpoint at step {data.get('step')}"
    if kind == "attempt.stop_requested":
        return f"{label} asked to checkpoint and stop ({data.get('kind', 'stop')}): {data.get('why', '')}"
    if kind.startswith("attempt."):
        state = kind.split(".", 1)[1].upper()
        if attempt is None:
            return f"attempt {state}{why}"
        lost = lost_steps(attempt)
        saved = attempt.get("checkpoint_step")
        tail = f" at step {attempt.get('step')}" if attempt.get("step") is not None else ""
        if state != "SUCCEEDED" and lost is not None:
            tail += f"; last checkpoint step {saved if saved is not None else 'none'}, {lost} step(s) lost"
        return f"{label} {state}{tail}{why}"
    if kind == "job.pending":
        return f"back in the queue{why}"
    if kind == "job.cancel_requested":
        return f"cancel requested by {data.get('by', '?')}"
    if kind == "job.checkpoint_moved":
        return f"checkpoint copied to site {data.get('site', '?')}: {data.get('to', '')}"
    if kind in TERMINAL_JOB_EVENTS:
        return f"job {kind.split('.', 1)[1].upper()}{why}"
    return f"{kind}{why}"


def summary(job: Mapping[str, Any]) -> str:
    """One line over the whole job: its state, attempts and the progress lost to interruptions."""
    attempts = job.get("attempts") or []
    interrupted = [a for a in attempts if a["state"] in ("PREEMPTED", "LOST")]
    lost = sum(lost_steps(a) or 0 for a in interrupted)
    return (
        f"job {job['id']} {job['state']} after {len(attempts)} attempt(s), "
        f"{len(interrupted)} interrupted, {lost} step(s) lost"
        + (f": {job['reason']}" if job.get("reason") else "")
    )


class Story:
    """One job's events told in order; a checkpoint step already told is not told again (heartbeats
    repeat the newest checkpoint, and a resumed attempt first reports the one it resumed from)."""

    def __init__(self) -> None:
        self._checkpoint: int | None = None

    def recall(self, event: Mapping[str, Any]) -> None:
        """Take in an event told before (by an earlier trigger) without telling it again."""
        self.tell(event, None)

    def tell(self, event: Mapping[str, Any], job: Mapping[str, Any] | None) -> str | None:
        if event["type"] == "attempt.checkpointed":
            step = (event.get("data") or {}).get("step")
            if step == self._checkpoint:
                return None
            self._checkpoint = step
        return describe(event, job)
