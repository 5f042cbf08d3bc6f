"""The story a training task's log tells, from the events alone."""

from __future__ import annotations

from gpuyard_provider.narration import Story, tell_batch


def event(seq: int, kind: str, attempt: str | None = "a1", **data: object) -> dict[str, object]:
    return {"seq": seq, "type": kind, "job_id": "job-1", "attempt_id": attempt, "data": data}


def test_an_interruption_tells_the_progress_lost_from_its_event() -> None:
    story = Story()
    batch = [
        event(1, "job.scheduled", reason="attempt 1 on node-3"),
        event(2, "attempt.running"),
        event(3, "attempt.checkpointed", step=100),
        event(4, "attempt.preempted", reason="evicted", step=130, checkpoint_step=100),
    ]
    assert not any(story.needs_attempt(e) for e in batch)
    lines = tell_batch(story, batch, None)
    assert lines[-1] == (
        "gpuyard job job-1 #4: attempt 1 PREEMPTED at step 130; "
        "last checkpoint step 100, 30 step(s) lost: evicted"
    )
    assert story.summary("job-1", "SUCCEEDED", None).endswith("1 interrupted, 30 step(s) lost")


def test_an_interruption_recorded_without_its_steps_reads_the_attempt() -> None:
    story = Story()
    older = event(4, "attempt.lost", reason="lease expired")
    assert story.needs_attempt(older)
    job = {"attempts": [{"id": "a1", "step": 50, "checkpoint_step": None}]}
    (line,) = tell_batch(story, [older], job)
    assert line.endswith("attempt LOST at step 50; last checkpoint step none, 50 step(s) lost: lease expired")
