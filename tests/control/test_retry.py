"""The retry policy's answer to repeated losses (domain/retry.py), over any schedule of losses."""

from __future__ import annotations

from gpuyard.domain.retry import LOSS_WINDOW_S, after_loss
from gpuyard.domain.spec import RetryPolicy
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
