"""The retry policy's answer to repeated losses (domain/retry.py), over any schedule of losses."""

from __future__ import annotations

from gpuyard.domain.retry import LOSS_WINDOW_S, after_loss, attribute
from gpuyard.domain.spec import RetryPolicy
from gpuyard.domain.states import AttemptState, StopReason
from hypothesis import given
from hypothesis import strategies as st


@given(
    cap=st.integers(1, 8),
    backoff_s=st.integers(1, 120),
    runs_s=st.lists(st.integers(0, 900), min_size=1, max_size=40),  # whole seconds: exact sums,
)
def test_no_job_is_lost_more_than_its_cap_in_any_hour(cap: int, backoff_s: int, runs_s: list[int]) -> None:
    """Each attempt starts once its wait is over and is lost after running `runs_s[i]`: whatever the
    run times, no hour holds more than `lost_per_hour` losses, and a lone loss resumes at once (unless
    the cap is one)."""
    policy = RetryPolicy(lost_backoff=f"{backoff_s}s", lost_per_hour=cap)
    losses: list[float] = []
    start = 0.0
    for ran_s in runs_s:
        at = start + ran_s
        earlier = [at - t for t in losses if at - t < LOSS_WINDOW_S]
        wait_s, why = after_loss(policy, earlier)
        if not earlier and cap > 1:
            assert (wait_s, why) == (0.0, "resumes")
        losses.append(at)
        start = at + wait_s
    for i, first in enumerate(losses):
        assert sum(1 for t in losses[i:] if t - first < LOSS_WINDOW_S) <= cap


def test_the_platform_s_signal_after_a_preemption_request_is_a_preemption_not_a_failure() -> None:
    """A plain command has no SIGTERM handler: preempted, it dies of the signal (or of SIGKILL after
    the grace period). That is the platform's doing; dying of it unasked, or of another signal while
    asked, stays the job's failure."""
    for code in (-15, -9):
        state, why = attribute(
            AttemptState.FAILED, code, f"killed by signal {-code}", stop=StopReason.PREEMPT, disrupted=True
        )
        assert state == AttemptState.PREEMPTED and "stopped by the platform's preemption" in (why or "")
    assert attribute(AttemptState.FAILED, -15, "killed", stop=None, disrupted=False)[0] == AttemptState.FAILED
    assert attribute(AttemptState.FAILED, -11, "segfault", stop=StopReason.PREEMPT, disrupted=True)[0] == (
        AttemptState.FAILED
    )
    for stop in (StopReason.HANG, StopReason.MAX_RUNTIME):
        assert (
            attribute(AttemptState.FAILED, -15, "killed", stop=stop, disrupted=True)[0] == AttemptState.FAILED
        )
