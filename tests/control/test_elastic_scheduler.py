"""The scheduler service sizes elastic jobs (`resources.gpus: {min, max}`) against a real store: it grows
them into idle GPUs, shrinks them before it preempts anyone, and does not resize for less than the
restart costs. Sizes come from the step times the attempts report in their heartbeats; a resize is a
stop (the preemption path) and the next attempt placed at the new size."""

from __future__ import annotations

from typing import Any

import pytest
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.launchers.base import LaunchRequest, Outcome, WorkerReport
from gpuyard.scheduler.service import SchedulerService
from gpuyard.store import attempts as attempt_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.tables import attempts
from sqlalchemy import Engine, update

from .test_scheduler_service import FLEET, Clock, RecordingLauncher, beat, live_attempts, spec, state, submit

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

BATCH = 128  # the global batch the runtime keeps at every size; micro-batches of at most 32


@pytest.fixture
def clock() -> Clock:
    return Clock()


class AliveLauncher(RecordingLauncher):
    """Every attempt it launches stays alive (renewed by it) until it reports its end."""

    def launch(self, request: LaunchRequest) -> None:
        super().launch(request)
        self.running.add(request.attempt_id)

    def acknowledge(self, report: WorkerReport) -> None:
        super().acknowledge(report)
        self.running.discard(report.attempt_id)


@pytest.fixture
def launcher() -> RecordingLauncher:
    return AliveLauncher()


@pytest.fixture
def service(engine: Engine, launcher: RecordingLauncher, clock: Clock) -> SchedulerService:
    """gpuyard's policy (elastic sizing `goodput`) on two domains of two 4-GPU nodes."""
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=16), clock())
    return SchedulerService(engine, launcher, FLEET, api_url=lambda: "http://api", clock=clock)


def elastic(name: str = "train", low: int = 1, high: int = 4, **changes: Any) -> dict[str, Any]:
    return spec(name, **changes) | {"resources": {"gpus": {"min": low, "max": high}, "gpu_types": ["a100"]}}


def gpus_of(request: LaunchRequest) -> int:
    return sum(len(piece.gpu_indices) for piece in request.placement.slices)


def measure(engine: Engine, request: LaunchRequest, clock: Clock, step_s: float) -> None:
    """A beat of the attempt's workers with their measured step at its size (micro-batches of 32)."""
    workers = gpus_of(request)
    micro = min(32, BATCH // workers)
    throughput = {"step_s": step_s, "local_batch": micro, "accum_steps": BATCH // workers // micro}
    beat(engine, request, clock, step=10, throughput=throughput | {"global_batch": BATCH})


def launched(launcher: RecordingLauncher, job_id: str) -> list[LaunchRequest]:
    return [r for r in launcher.launched.values() if r.job_id == job_id]


def stop(
    service: SchedulerService, launcher: RecordingLauncher, engine: Engine, clock: Clock, attempt: str
) -> None:
    """The attempt asked to stop checkpoints and exits preempted; the next pass places the job again."""
    assert beat(engine, launcher.launched[attempt], clock, step=11).action == "checkpoint_and_stop"
    launcher.pending_reports.append(WorkerReport(attempt, Outcome.PREEMPTED, clock(), 75, "saved"))
    service.step()


def test_an_elastic_job_grows_into_idle_gpus_as_its_measured_speedup_pays_the_restart(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job = submit(engine, clock, elastic())
    service.step()
    (first,) = launched(launcher, job)
    assert gpus_of(first) == 1  # nothing measured yet: it starts at its min
    clock.advance(20)  # its first new step 20 s after its start: the restart it measured
    measure(engine, first, clock, step_s=1.0)
    clock.advance(600)
    service.step()
    # Its model (whole steps measured at 1 GPU, the prior's sync within a node) predicts a speedup on
    # 4 GPUs that pays the restart: the whole node, its max, and within four times what it ran. The
    # attempt is asked to stop ...
    assert [a for a, _ in launcher.cancelled] == [first.attempt_id]
    stop(service, launcher, engine, clock, first.attempt_id)
    # ... and the job's next attempt is placed at the new size.
    second = launched(launcher, job)[-1]
    assert second.attempt_id != first.attempt_id and gpus_of(second) == 4
    clock.advance(20)
    measure(engine, second, clock, step_s=0.3)
    clock.advance(600)
    service.step()
    assert len(launcher.cancelled) == 1  # at its max, it is not resized again
    assert state(engine, job) in ("SCHEDULED", "RUNNING")


def test_an_elastic_job_shrinks_before_anyone_is_preempted(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    # What its family measured (a run of the same name, on 4 GPUs): its prior, so it starts wide.
    mate = submit(engine, clock, spec("train", gpus=4))
    service.step()
    (ran,) = launched(launcher, mate)
    measure(engine, ran, clock, step_s=0.3)
    launcher.pending_reports.append(WorkerReport(ran.attempt_id, Outcome.SUCCEEDED, clock(), 0, "done"))
    low = [submit(engine, clock, spec(f"low{i}", priority="low", preemptible=True)) for i in range(3)]
    # Not preemptible: its min is its own, the GPUs above it are lent (a range consents to resizes).
    job = submit(engine, clock, elastic(preemptible=False))
    service.step()
    (wide,) = launched(launcher, job)
    assert gpus_of(wide) == 4 and not launcher.cancelled  # the fleet is full
    # A fixed job of a higher class: the elastic job gives back its GPUs above its min, and no
    # low-priority job is preempted.
    urgent = submit(engine, clock, spec("urgent", gpus=2, priority="high"))
    service.step()
    assert [a for a, _ in launcher.cancelled] == [wide.attempt_id]
    stop(service, launcher, engine, clock, wide.attempt_id)
    assert state(engine, urgent) in ("SCHEDULED", "RUNNING")
    assert gpus_of(launched(launcher, job)[-1]) == 2  # back at what is left beside it, no restart waited
    assert all(state(engine, j) in ("SCHEDULED", "RUNNING") for j in low)
    assert len(launcher.cancelled) == 1


def test_an_elastic_job_is_not_resized_for_less_than_its_restart_costs(
    engine: Engine, service: SchedulerService, launcher: RecordingLauncher, clock: Clock
) -> None:
    job = submit(engine, clock, elastic(high=2))
    service.step()
    (first,) = launched(launcher, job)
    clock.advance(60)  # a restart of 60 s: its first new step a minute after its start
    measure(engine, first, clock, step_s=1.0)
    # 2 GPUs would be 1.8x as fast; while the job is young its horizon is its age, and the restart
    # takes more than the speedup gives (at 120 s: 1.8 x (1 - 60/120) < 1). No resize.
    for _ in range(3):
        service.step()
        clock.advance(20)
    assert launcher.cancelled == [] and len(live_attempts(engine, job)) == 1
    # Once its horizon (10 restarts) makes the restart a tenth, the speedup pays: it grows.
    clock.advance(600)
    service.step()
    assert [a for a, _ in launcher.cancelled] == [first.attempt_id]


def test_a_pass_reads_only_a_family_s_newest_measures(engine: Engine, clock: Clock) -> None:
    """A pipeline's retrainings accumulate measured attempts for ever: a pass reads the newest of each
    family (team, name), not its whole history."""
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=4096), clock())
    kept = attempt_store.MEASURES_PER_FAMILY
    name = f"retrain-{clock().timestamp():.0f}"
    made = []
    for n in range(kept + 3):
        clock.advance(1)
        job_id = submit(engine, clock, elastic(name))
        placement = Placement("s", "c", "d", (NodeSlice(f"n{n}", (0,)),))
        (attempt,) = reserve_batch(
            engine, [Reservation(job_id, placement, False)], at=clock(), lease_ttl_s=60
        )
        assert attempt is not None
        with engine.begin() as conn:
            conn.execute(update(attempts).where(attempts.c.id == attempt.id).values(step_s=1.0 + n))
        made.append(attempt.id)
    with engine.connect() as conn:
        found = attempt_store.measured(conn, {("a", name), ("a", "nothing-measured")})
    assert list(found) == [("a", name)]
    assert [a.id for a in found["a", name]] == made[-kept:]  # the newest, oldest first
    assert [a.step_s for a in found["a", name]] == [1.0 + n for n in range(3, kept + 3)]
