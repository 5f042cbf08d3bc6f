"""Elastic jobs in the scheduler: the sizing rules by name (`SIZINGS`), and each elastic job's sizes as
a cycle reads them (`elastic`), from the step times its attempts reported in their heartbeats.

A policy names its sizing rule (`policy.Policy.sizing`), beside its preemption rules:
- `min`: an elastic job is placed at its `min` and stays there (a fixed-size job of that size);
- `goodput`: shrink before preempt (a job that does not fit first takes back the GPUs elastic jobs
  hold above their min: `preemption.SHRINK`), and grow into idle GPUs (once no job waits for room,
  idle GPUs go to the elastic jobs whose goodput they raise most: `domain.elastic.sizes`, each
  resize of a running attempt charged its restart). A resize is a stop and a start: the running
  attempt is asked to checkpoint and stop (the preemption path), and the job's next attempt is
  placed at the size its next cycle gives it.

The model and the rule are `domain.elastic`'s, the Pollux replay's too (`sim/elastic/sizing.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuyard.domain.elastic import Measured, Sizing, StepModel, growth_limit, keep_factor, sizes, worker_split
from gpuyard.domain.model import Attempt, Job
from gpuyard.scheduler.snapshot import Elastic

# A resize's cost until the job measured one (its last attempt's start to its first new step, plus
# the checkpoint it saved before stopping): the Pollux study's restart.
RESTART_S = 30.0
# The prior where the job and its family measured nothing apart: a step's compute proportional to
# its examples, no fixed cost, no sync on one GPU; its seconds come from the job's whole steps.
PRIOR_COMPUTE = (0.0, 1.0)


@dataclass(frozen=True)
class SizingRule:
    name: str
    shrinks: bool  # a job that does not fit takes elastic jobs' GPUs above their min first
    grows: bool  # idle GPUs go to elastic jobs by marginal goodput


SIZINGS: dict[str, SizingRule] = {
    rule.name: rule for rule in (SizingRule("min", False, False), SizingRule("goodput", True, True))
}


def family(job: Job) -> tuple[str, str]:
    """The jobs whose measures are a job's prior until it has its own: its team's of the same name
    (a pipeline's retrainings, a sweep's runs)."""
    return job.team, job.name


def elastic(job: Job, measured: Sequence[Attempt], now: datetime, holding: int = 0) -> Elastic | None:
    """An elastic job's sizes now, from the attempts of its own (or, with none, of its family) that
    reported a step time (`measured`); None for a fixed-size job. `holding`: the GPUs its live
    attempt holds (0: none), a size it keeps whatever the model says.

    Its sizes: every size of its range the measured global batch splits over, up to
    `domain.elastic.growth_limit` (it at most quadruples what it ran); before any measure its min
    alone. Goodput is steps per second: the runtime keeps the global batch fixed at every size, so a
    step is worth the same at any size."""
    resources = job.spec.resources
    if not resources.elastic:
        return None
    own = [a for a in measured if a.job_id == job.id]
    runs = [a for a in (own or measured) if a.step_s and a.local_batch and a.accum_steps and a.global_batch]
    start = holding or resources.gpus
    keep = keep_factor((now - job.created_at).total_seconds(), restart_s(job, own), restart_s(job, own))
    if not runs:
        return Elastic(resources.gpus, ((start, 1.0),), keep)
    newest = max(runs, key=lambda a: a.created_at)
    batch, bound = newest.global_batch or 0, max(a.local_batch or 0 for a in runs)
    model = StepModel(PRIOR_COMPUTE, 0.0, _split(batch, resources.gpus, bound)[0])
    for attempt in runs:
        model.observe(
            resources.nodes,
            _gpus(attempt),
            attempt.local_batch or 0,
            Measured(attempt.step_s or 0.0, attempt.accum_steps or 0),
        )
    limit = max(growth_limit(model, resources.gpus), holding)
    goodput = []
    for gpus in resources.sizes:
        split = worker_split(batch, gpus, bound)
        if gpus <= limit and split is not None:
            goodput.append((gpus, 1.0 / model.step_s(resources.nodes, gpus, *split)))
    if start not in dict(goodput):  # its batch does not split over it: it is not sized
        return Elastic(resources.gpus, ((start, 1.0),), keep)
    return Elastic(resources.gpus, tuple(goodput), keep)


def restart_s(job: Job, attempts: Iterable[Attempt]) -> float:
    """What a resize costs the job: its newest measured start (launch to its first new step) and the
    checkpoint it saves before it stops; `RESTART_S` before it measured a start."""
    started = [a for a in attempts if a.new_step_at is not None]
    if not started:
        return RESTART_S
    newest = max(started, key=lambda a: a.created_at)
    assert newest.new_step_at is not None
    return (newest.new_step_at - newest.created_at).total_seconds() + (job.checkpoint_cost_s or 0.0)


def growth(jobs: Sequence[Sizing], idle: int) -> dict[str, list[int]]:
    """The sizes worth trying for each job `sizes` gives more than its start out of `idle` GPUs,
    largest first: those up to its target whose goodput (after its restart, for a held size left)
    beats its start's. A cycle takes the first that finds room."""
    targets = sizes(jobs, idle + sum(job.start for job in jobs))
    tries: dict[str, list[int]] = {}
    for job in jobs:
        here = job.goodput[job.start]
        charge = job.keep if job.held else 1.0
        target = targets[job.name]
        larger = [g for g in job.goodput if job.start < g <= target and job.goodput[g] * charge > here]
        if larger:
            tries[job.name] = sorted(larger, reverse=True)
    return tries


def _gpus(attempt: Attempt) -> int:
    return sum(len(node["gpus"]) for node in attempt.placement["nodes"])


def _split(batch: int, gpus: int, bound: int) -> tuple[int, int]:
    return worker_split(batch, gpus, bound) or (bound, 1)
