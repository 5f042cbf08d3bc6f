"""Summary figures of one simulation: JCT, queue wait, utilization, goodput, fairness, cost, makespan.

The figures the running platform shows too (leased, useful and lost GPU time, goodput, resume success,
queue wait percentiles, cost) come from the accounting (domain/accounting.py, docs/metrics.md), fed
with the simulator's ended attempts; every percentile here is its nearest rank. The simulator's own
(docs/simulator.md lists them):
- JCT: finish - submit. Pending: all time spent queued, requeues after preemption or interruption
  included.
- utilization: GPU-seconds leased while jobs were arriving (first to last submit) / (fleet GPUs x that
  window): how busy the fleet kept while the trace offered load. `util_span` divides all GPU-seconds
  leased by the fleet's GPUs x (last finish - first submit); a single long job's tail dominates it.
- Jain's fairness index over teams of each team's mean (duration / JCT), the share of its time a job
  spends doing its work: 1 when every team's jobs are slowed alike.
- stranded GPUs: free GPUs of nodes that are up on which no queued job fits (fewer free than any
  queued job allowed on that GPU model asks per node): fragmentation. Its average over the same
  window as utilization; `stranded_over_time` gives it per period.
- slowdown: JCT / max(duration, 10 s), at least 1 (Feitelson's bounded slowdown: a 2 s job that
  waited a minute is not slowed 30 times); its worst and 99.9th percentile per job size class
  (1 GPU, 2-8, more than 8) and per team: the tail a starvation guard bounds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from itertools import pairwise

from gpuyard.domain.accounting import AttemptUse, JobUse, figures, percentile
from gpuyard.sim.engine import AttemptResult, JobResult, SimResult
from gpuyard.sim.sites import peak_overlap

SLOWDOWN_FLOOR_S = 10.0
# Job size classes by the GPUs asked: (name, fewest, most).
SIZE_CLASSES: tuple[tuple[str, int, float], ...] = (
    ("1 GPU", 1, 1),
    ("2-8 GPUs", 2, 8),
    (">8 GPUs", 9, float("inf")),
)


@dataclass(frozen=True)
class Tail:
    """The slowdown tail of a group of jobs."""

    jobs: int
    worst: float
    p999: float  # 99.9th percentile

    @classmethod
    def of(cls, slowdowns: Iterable[float]) -> Tail:
        values = sorted(slowdowns)
        if not values:
            return cls(0, 0.0, 0.0)
        return cls(len(values), values[-1], percentile(values, 99.9) or 0.0)


def slowdown(job: JobResult) -> float:
    return max(1.0, job.jct_s / max(job.duration_s, SLOWDOWN_FLOOR_S))


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    rejected: int
    avg_jct_h: float
    p50_jct_h: float
    p99_jct_h: float
    avg_wait_h: float
    p50_wait_h: float  # queue wait (docs/metrics.md); 0 with no job
    p99_wait_h: float
    avg_pending_h: float
    p99_pending_h: float
    utilization: float
    util_span: float
    stranded_gpus: float  # average between the first and the last submit
    leased_gpu_h: float
    useful_gpu_h: float
    goodput: float | None  # None: nothing leased
    lost_gpu_h: float
    resume_success: float | None  # None: no resume
    resumes: int
    preemptions: int
    preemptions_by_rule: dict[str, int]
    interruptions: int
    cost_usd: float
    cost_per_job_usd: float | None
    jain: float
    makespan_h: float
    cycles: int
    slowdown_by_size: dict[str, Tail]  # per SIZE_CLASSES name
    slowdown_by_team: dict[str, Tail]
    # Sites (engine.SimConfig.sites; 0 without): attempts started away from the site holding the job's
    # state, those that copied a checkpoint, the bytes copied (TB: 10^12) and their egress.
    moves: int = 0
    checkpoint_moves: int = 0
    tb_moved: float = 0.0
    egress_usd: float = 0.0
    peak_copies: int = 0  # copies under way at once, at most (each is charged the whole WAN)

    def as_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)


def jain_index(values: list[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything."""
    if not values:
        return 1.0
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def attempt_use(a: AttemptResult) -> AttemptUse:
    """A simulated attempt as the accounting reads it: its workers run from its start."""
    held = a.end_s - a.start_s
    return AttemptUse(
        job_id=a.job_id,
        team=a.team,
        outcome=a.outcome.value,
        gpus=a.gpus,
        busy_gpus=a.busy_gpus,
        held_s=held,
        ran_s=held,
        restore_s=a.restore_s,
        stall_s=a.stall_s,
        lost_s=a.lost_s,
        resumed=a.resumed,
        made_step=a.made_step,
        price_per_hour=a.price_per_hour,
    )


def job_use(j: JobResult) -> JobUse:
    return JobUse(j.id, j.team, j.wait_s, finished=True)  # a simulation ends when every job has


def summarize(result: SimResult) -> Summary:
    jobs = result.jobs
    hour = 3600.0
    got = figures(map(attempt_use, result.attempts), map(job_use, jobs))
    jct = [j.jct_s / hour for j in jobs]
    wait = [j.wait_s / hour for j in jobs]
    pending = [j.pending_s / hour for j in jobs]
    first = min((j.submitted_s for j in jobs), default=0.0)
    span = max(result.end_s - first, 1e-9)
    totals = result.totals
    capacity = max(result.capacity_gpus, 1)
    window = max(result.last_submit_s - first, 1e-9)
    per_team: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        per_team[j.team].append(j.duration_s / j.jct_s if j.jct_s > 0 else 1.0)

    def pct(values: list[float], q: float) -> float:
        return percentile(values, q) or 0.0

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return Summary(
        policy=result.policy,
        jobs=len(jobs),
        rejected=len(result.rejected),
        avg_jct_h=mean(jct),
        p50_jct_h=pct(jct, 50),
        p99_jct_h=pct(jct, 99),
        avg_wait_h=mean(wait),
        p50_wait_h=(got.wait_p50_s or 0.0) / hour,
        p99_wait_h=(got.wait_p99_s or 0.0) / hour,
        avg_pending_h=mean(pending),
        p99_pending_h=pct(pending, 99),
        utilization=totals.leased_in_window_gpu_s / (capacity * window),
        util_span=got.leased_gpu_s / (capacity * span),
        stranded_gpus=totals.stranded_in_window_gpu_s / window,
        leased_gpu_h=got.leased_gpu_s / hour,
        useful_gpu_h=got.useful_gpu_s / hour,
        goodput=got.goodput,
        lost_gpu_h=got.lost_gpu_s / hour,
        resume_success=got.resume_success,
        resumes=got.resumes,
        preemptions=totals.preemptions,
        preemptions_by_rule=dict(sorted(totals.preemptions_by_rule.items())),
        interruptions=totals.interruptions,
        cost_usd=got.cost,
        cost_per_job_usd=got.cost_per_finished_job,
        jain=jain_index([sum(v) / len(v) for v in per_team.values()]),
        makespan_h=span / hour,
        cycles=totals.cycles,
        slowdown_by_size={
            name: Tail.of(slowdown(j) for j in jobs if low <= j.gpus <= high)
            for name, low, high in SIZE_CLASSES
        },
        slowdown_by_team={
            team: Tail.of(slowdown(j) for j in jobs if j.team == team) for team in sorted(per_team)
        },
        moves=totals.moves,
        checkpoint_moves=totals.checkpoint_moves,
        tb_moved=totals.bytes_moved / 1e12,
        egress_usd=totals.egress_usd,
        peak_copies=peak_overlap(totals.copies),
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
    ("stranded_gpus", "stranded GPUs", "{:.1f}"),
    ("goodput", "goodput", "{:.3f}"),
    ("lost_gpu_h", "lost GPU-h", "{:.0f}"),
    ("resume_success", "resume ok", "{:.3f}"),
    ("preemptions", "preempt", "{}"),
    ("cost_usd", "cost $", "{:,.0f}"),
    ("jain", "Jain", "{:.3f}"),
    ("makespan_h", "makespan h", "{:.1f}"),
)


def shown(fmt: str, value: object) -> str:
    """`value` formatted, or "-" for a figure with no value (goodput with nothing leased)."""
    return "-" if value is None else fmt.format(value)


def markdown_table(summaries: list[Summary]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = [
        "| " + " | ".join(shown(fmt, getattr(s, key)) for key, _, fmt in COLUMNS) + " |" for s in summaries
    ]
    return "\n".join([head, rule, *rows])


def stranded_over_time(result: SimResult, periods: int) -> list[float]:
    """Average stranded GPUs in each of `periods` equal parts of the submit window."""
    first = min((j.submitted_s for j in result.jobs), default=0.0)
    width = max(result.last_submit_s - first, 1e-9) / periods
    totals = [0.0] * periods
    changes = [*result.stranded, (result.end_s, 0)]
    for (since, value), (until, _) in pairwise(changes):
        for k in range(periods):
            low, high = first + k * width, first + (k + 1) * width
            overlap = min(until, high) - max(since, low)
            if overlap > 0:
                totals[k] += value * overlap
    return [total / width for total in totals]


def _tail(tail: Tail) -> str:
    return f"{tail.worst:,.0f} / {tail.p999:,.1f}" if tail.jobs else "-"


def slowdown_table(summaries: list[Summary]) -> str:
    """Worst / p99.9 slowdown per policy and job size class."""
    head = "| policy | " + " | ".join(f"{name} worst / p99.9" for name, _, _ in SIZE_CLASSES) + " |"
    rule = "|---|" + "|".join("---" for _ in SIZE_CLASSES) + "|"
    rows = [
        f"| {s.policy} | " + " | ".join(_tail(s.slowdown_by_size[name]) for name, _, _ in SIZE_CLASSES) + " |"
        for s in summaries
    ]
    return "\n".join([head, rule, *rows])


def team_slowdown_table(summaries: list[Summary]) -> str:
    """Worst / p99.9 slowdown per team (rows) and policy (columns), with each team's job count."""
    teams = sorted({team for s in summaries for team in s.slowdown_by_team})
    head = "| team | jobs | " + " | ".join(s.policy for s in summaries) + " |"
    rule = "|---|---|" + "|".join("---" for _ in summaries) + "|"
    rows = []
    for team in teams:
        jobs = max(s.slowdown_by_team[team].jobs for s in summaries if team in s.slowdown_by_team)
        cells = [_tail(s.slowdown_by_team.get(team, Tail(0, 0.0, 0.0))) for s in summaries]
        rows.append(f"| {team} | {jobs} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; 1 when both are 0 (an idle window: nobody waited)."""
    if theirs == 0:
        return 1.0 if ours == 0 else float("inf")
    return ours / theirs


BASELINES = ("fifo", "fifo-backfill", "kueue", "tiresias")


def result_line(summaries: dict[str, Summary]) -> str:
    """The benchmarks' RESULT line: gpuyard against each baseline, the figure each target names."""
    ours = summaries["gpuyard"]
    return (
        f"RESULT avg_jct_vs_fifo={ratio(ours.avg_jct_h, summaries['fifo'].avg_jct_h):.3f} "
        f"avg_jct_vs_tiresias={ratio(ours.avg_jct_h, summaries['tiresias'].avg_jct_h):.3f} "
        f"p99_wait_vs_fifo_backfill={ratio(ours.p99_wait_h, summaries['fifo-backfill'].p99_wait_h):.3f} "
        f"util_vs_fifo_backfill={ratio(ours.utilization, summaries['fifo-backfill'].utilization):.3f} "
        f"goodput={shown('{:.3f}', ours.goodput)} "
        f"jain_vs_kueue={ratio(ours.jain, summaries['kueue'].jain):.3f}"
    )


def report(summaries: list[Summary]) -> str:
    """The figures table, the slowdown tails per size class and per team, preemptions per rule."""
    parts = [
        markdown_table(summaries),
        "Slowdown (JCT / max(duration, 10 s)) per job size class, worst / p99.9:",
        slowdown_table(summaries),
        "Slowdown per team, worst / p99.9:",
        team_slowdown_table(summaries),
        "\n".join(
            f"{s.policy} preemptions by rule: {s.preemptions_by_rule}" for s in summaries if s.preemptions
        ),
    ]
    return "\n\n".join(part for part in parts if part)
