"""Summary figures of one simulation: JCT, queue wait, utilization, goodput, fairness, cost, makespan.

Definitions (docs/simulator.md repeats them):
- JCT: finish - submit. Queue wait: submit -> first start. Pending: all time spent queued, requeues
  after preemption or interruption included.
- utilization: GPU-seconds leased while jobs were arriving (first to last submit) / (fleet GPUs x that
  window): how busy the fleet kept while the trace offered load. `util_span` divides all GPU-seconds
  leased by the fleet's GPUs x (last finish - first submit); a single long job's tail dominates it.
- goodput: GPU-seconds of progress that was kept (duration x GPUs of every finished job) / GPU-seconds
  leased (restores, checkpoint writes, progress lost to interruptions and rounding a gang up to whole
  slices are leased but not kept).
- Jain's fairness index over teams of each team's mean (duration / JCT), the share of its time a job
  spends doing its work: 1 when every team's jobs are slowed alike.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np
from gpuyard.sim.engine import SimResult


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    rejected: int
    avg_jct_h: float
    p50_jct_h: float
    p99_jct_h: float
    avg_wait_h: float
    p50_wait_h: float
    p99_wait_h: float
    avg_pending_h: float
    p99_pending_h: float
    utilization: float
    util_span: float
    goodput: float
    lost_gpu_h: float
    resume_success: float
    resumes: int
    preemptions: int
    interruptions: int
    cost_usd: float
    jain: float
    makespan_h: float
    cycles: int

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def jain_index(values: list[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything."""
    if not values:
        return 1.0
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def summarize(result: SimResult) -> Summary:
    jobs = result.jobs
    hour = 3600.0
    jct = np.array([j.jct_s for j in jobs], dtype=float) / hour
    wait = np.array([j.wait_s for j in jobs], dtype=float) / hour
    pending = np.array([j.pending_s for j in jobs], dtype=float) / hour
    first = min((j.submitted_s for j in jobs), default=0.0)
    span = max(result.end_s - first, 1e-9)
    totals = result.totals
    capacity = max(result.capacity_gpus, 1)
    window = max(result.last_submit_s - first, 1e-9)
    per_team: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        per_team[j.team].append(j.duration_s / j.jct_s if j.jct_s > 0 else 1.0)

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if len(values) else 0.0

    def mean(values: np.ndarray) -> float:
        return float(values.mean()) if len(values) else 0.0

    return Summary(
        policy=result.policy,
        jobs=len(jobs),
        rejected=len(result.rejected),
        avg_jct_h=mean(jct),
        p50_jct_h=pct(jct, 50),
        p99_jct_h=pct(jct, 99),
        avg_wait_h=mean(wait),
        p50_wait_h=pct(wait, 50),
        p99_wait_h=pct(wait, 99),
        avg_pending_h=mean(pending),
        p99_pending_h=pct(pending, 99),
        utilization=totals.leased_in_window_gpu_s / (capacity * window),
        util_span=totals.leased_gpu_s / (capacity * span),
        goodput=totals.kept_gpu_s / totals.leased_gpu_s if totals.leased_gpu_s else 1.0,
        lost_gpu_h=totals.lost_gpu_s / hour,
        resume_success=totals.resumes_ok / totals.resumes if totals.resumes else 1.0,
        resumes=totals.resumes,
        preemptions=totals.preemptions,
        interruptions=totals.interruptions,
        cost_usd=totals.cost,
        jain=jain_index([sum(v) / len(v) for v in per_team.values()]),
        makespan_h=span / hour,
        cycles=totals.cycles,
    )


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("jobs", "jobs", "{}"),
    ("avg_jct_h", "avg JCT h", "{:.2f}"),
    ("p50_jct_h", "p50 JCT h", "{:.3f}"),
    ("p99_jct_h", "p99 JCT h", "{:.1f}"),
    ("avg_wait_h", "avg wait h", "{:.2f}"),
    ("p99_wait_h", "p99 wait h", "{:.2f}"),
    ("avg_pending_h", "avg pending h", "{:.2f}"),
    ("utilization", "util", "{:.3f}"),
    ("goodput", "goodput", "{:.3f}"),
    ("lost_gpu_h", "lost GPU-h", "{:.0f}"),
    ("resume_success", "resume ok", "{:.3f}"),
    ("preemptions", "preempt", "{}"),
    ("cost_usd", "cost $", "{:,.0f}"),
    ("jain", "Jain", "{:.3f}"),
    ("makespan_h", "makespan h", "{:.1f}"),
)


def markdown_table(summaries: list[Summary]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = [
        "| " + " | ".join(fmt.format(getattr(s, key)) for key, _, fmt in COLUMNS) + " |" for s in summaries
    ]
    return "\n".join([head, rule, *rows])
