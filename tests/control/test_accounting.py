"""One accounting (domain/accounting.py, docs/metrics.md): its definitions, and one recorded history
replayed through both the running platform (the workers' heartbeats over HTTP, the store in
PostgreSQL, `metric_records`, `/v1/metrics/summary`) and the simulator's result objects, which must
give the same figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gpuyard.api.app import create_app
from gpuyard.domain.accounting import AttemptUse, percentile, resume_decided, resume_succeeded, split
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import AttemptState, StopReason
from gpuyard.platform_metrics import summarize as platform_summarize
from gpuyard.settings import Settings
from gpuyard.sim.engine import AttemptResult, JobResult, SimResult, Totals
from gpuyard.sim.metrics import summarize as sim_summarize
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.reservations import Reservation, reserve_batch
from sqlalchemy import Engine

from .conftest import EXAMPLE_SPEC, bearer

T0 = datetime(2026, 12, 1, 8, tzinfo=UTC)
PRICES = {"n1": 2.0, "n2": 3.0}  # per GPU-hour
FLEET = Fleet(
    nodes=tuple(
        Node(
            name=name,
            site="east",
            cluster="c",
            domain="d0",
            gpu_type="a100",
            gpus=8,
            price_per_gpu_hour=price,
        )
        for name, price in PRICES.items()
    )
)
CKPT = EXAMPLE_SPEC["checkpoint"]["url"].rstrip("/")


# -- the definitions ------------------------------------------------------------------------------


def use(outcome: AttemptState, **changes: Any) -> AttemptUse:
    fields: dict[str, Any] = {
        "job_id": "j",
        "team": "a",
        "outcome": outcome.value,
        "gpus": 2,
        "busy_gpus": 2.0,
        "held_s": 100.0,
        "ran_s": 90.0,
        "restore_s": 10.0,
        "stall_s": 5.0,
        "lost_s": 30.0,
        "resumed": True,
        "made_step": False,
        "price_per_hour": 6.0,
    }
    return AttemptUse(**(fields | changes))


def test_useful_time_is_the_kept_steps_only() -> None:
    # 100 s held: 10 s launching, 10 s restoring, 5 s stalled, 75 s of steps.
    assert split(use(AttemptState.SUCCEEDED)).useful_s == 75.0
    lost = split(use(AttemptState.LOST))
    assert (lost.lost_s, lost.useful_s, lost.launch_s) == (30.0, 45.0, 10.0)
    # Time since the newest checkpoint that ran into the restore is not steps: lost only up to the steps.
    assert split(use(AttemptState.PREEMPTED, lost_s=500.0)).lost_s == 75.0
    # A FAILED attempt keeps none of its steps, whatever it checkpointed; a cancel loses nothing.
    failed = split(use(AttemptState.FAILED, lost_s=0.0))
    assert (failed.lost_s, failed.useful_s) == (75.0, 0.0)
    assert split(use(AttemptState.CANCELLED)).lost_s == 0.0
    # Reports beyond what the attempt ran are clipped: the parts always add up to the lease.
    odd = split(use(AttemptState.LOST, restore_s=80.0, stall_s=50.0))
    assert odd.held_s == odd.launch_s + odd.restore_s + odd.stall_s + odd.lost_s + odd.useful_s == 100.0
    assert odd.useful_s == 0.0


def test_a_resume_succeeds_once_it_restored_and_made_a_new_step() -> None:
    restoring = use(AttemptState.RUNNING)
    assert not resume_decided(restoring)  # still restoring: not counted yet
    assert resume_succeeded(use(AttemptState.RUNNING, made_step=True))
    assert resume_decided(use(AttemptState.LOST)) and not resume_succeeded(use(AttemptState.LOST))
    assert resume_succeeded(use(AttemptState.SUCCEEDED))  # nothing was left to do after the restore
    assert not resume_decided(use(AttemptState.CANCELLED))  # the caller stopped it, not the platform
    assert not resume_decided(use(AttemptState.SUCCEEDED, resumed=False))


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0, 1.0], 50) == 1.0  # ceil(0.5 x 2) = rank 1
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert percentile([float(v) for v in range(1, 1001)], 99.9) == 999.0  # not 1000 by a float's error
    assert percentile([5.0], 0) == 5.0


# -- one recorded history, replayed through both ----------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One attempt of the history, seconds after T0. Its workers run as soon as it is reserved (the
    simulator has no launch time)."""

    node: str
    gpus: tuple[int, ...]
    start: float
    end: float
    outcome: AttemptState
    restore: tuple[int, float] | None = None  # (step restored, seconds), reported when it is done
    steps: tuple[tuple[float, int], ...] = ()  # (when, step) reported
    checkpoints: tuple[tuple[float, int, float], ...] = ()  # (saved at, step, stall so far)
    stall_s: float = 0.0  # all told, reported by its last beat


@dataclass(frozen=True)
class Story:
    name: str
    submitted: float
    runs: tuple[Run, ...]


HISTORY = (
    # Preempted at 730 s after a final checkpoint at 725 s (5 s lost), resumed: restored in 30 s.
    Story(
        "a",
        0.0,
        (
            Run(
                "n1",
                (0, 1, 2, 3),
                10.0,
                730.0,
                AttemptState.PREEMPTED,
                steps=((300.0, 40),),
                checkpoints=((610.0, 100, 20.0), (725.0, 125, 40.0)),
                stall_s=40.0,
            ),
            Run(
                "n1",
                (0, 1, 2, 3),
                800.0,
                1500.0,
                AttemptState.SUCCEEDED,
                restore=(125, 30.0),
                steps=((840.0, 126), (1400.0, 300)),
                stall_s=10.0,
            ),
        ),
    ),
    # Its node crashed 140 s after its checkpoint; the next attempt was lost while it restored (a
    # failed resume); the third resumed.
    Story(
        "b",
        50.0,
        (
            Run(
                "n2",
                (0, 1),
                60.0,
                400.0,
                AttemptState.LOST,
                steps=((200.0, 8),),
                checkpoints=((260.0, 10, 5.0),),
                stall_s=5.0,
            ),
            Run("n2", (0, 1), 460.0, 530.0, AttemptState.LOST, restore=(10, 50.0)),
            Run("n2", (0, 1), 600.0, 900.0, AttemptState.SUCCEEDED, restore=(10, 40.0), steps=((650.0, 11),)),
        ),
    ),
    # Its own code failed after a checkpoint (a FAILED attempt keeps nothing); the retry resumed.
    Story(
        "c",
        100.0,
        (
            Run(
                "n2",
                (2, 3),
                910.0,
                1000.0,
                AttemptState.FAILED,
                steps=((990.0, 5),),
                checkpoints=((960.0, 3, 5.0),),
                stall_s=5.0,
            ),
            Run(
                "n2", (2, 3), 1010.0, 1200.0, AttemptState.SUCCEEDED, restore=(3, 10.0), steps=((1030.0, 4),)
            ),
        ),
    ),
    Story("d", 200.0, (Run("n1", (4,), 300.0, 500.0, AttemptState.SUCCEEDED, steps=((400.0, 50),)),)),
)
NOW = 1600.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        return self.now


def _reports(run: Run) -> list[tuple[float, dict[str, Any]]]:
    """The beats its worker sends, in time order: what training/run.py reports."""
    beats: list[tuple[float, dict[str, Any]]] = []
    if run.restore is not None:
        step, seconds = run.restore
        beats.append((run.start + seconds, {"step": step, "restore": {"step": step, "seconds": seconds}}))
    for at, step, stall in run.checkpoints:
        checkpoint = {
            "url": f"{CKPT}/step-{step}",
            "step": step,
            "saved_at": (T0 + timedelta(seconds=at)).isoformat(),
        }
        beats.append((at, {"step": step, "checkpoint": checkpoint, "checkpoint_stall_s": stall}))
    beats += [(at, {"step": step}) for at, step in run.steps]
    beats.append((run.end, {"checkpoint_stall_s": run.stall_s}))  # its last beat, before it exits
    return sorted(beats, key=lambda beat: beat[0])


def _replay_on_the_platform(engine: Engine, api: TestClient, clock: Clock) -> None:
    for story in HISTORY:
        spec = EXAMPLE_SPEC | {"name": story.name, "team": "a"}
        spec["resources"] = {"gpus": len(story.runs[0].gpus), "nodes": 1, "gpu_types": ["a100"]}
        job, _ = job_store.submit(
            engine, parse_spec(spec), idempotency_key=None, created_by="t", at=clock.at(story.submitted)
        )
        for run in story.runs:
            placement = Placement("east", "c", "d0", (NodeSlice(run.node, run.gpus),))
            (attempt,) = reserve_batch(
                engine, [Reservation(job.id, placement, False)], at=clock.at(run.start), lease_ttl_s=3600
            )
            assert attempt is not None, f"{story.name}: not reserved"
            attempt_store.mark_running(engine, attempt.id, clock())
            url, secret = f"/v1/attempts/{attempt.id}/heartbeat", str(attempt.attempt_secret)
            for at, body in _reports(run):
                clock.at(at)
                answer = api.post(
                    url, json={"fencing_token": attempt.fencing_token, **body}, headers=bearer(secret)
                )
                assert answer.status_code == 200, answer.text
            clock.at(run.end)
            if run.outcome == AttemptState.PREEMPTED:
                assert attempt_store.request_stop(
                    engine, attempt.id, at=clock(), why="t", kind=StopReason.PREEMPT
                )
            codes = {AttemptState.SUCCEEDED: 0, AttemptState.FAILED: 1, AttemptState.PREEMPTED: 75}
            with engine.begin() as conn:
                assert attempt_store.finish(
                    conn, attempt.id, run.outcome, at=clock(), exit_code=codes.get(run.outcome), reason="t"
                )
        with engine.connect() as conn:
            stored = job_store.get(conn, job.id)
        assert stored is not None and stored.state.value == "SUCCEEDED", stored


def _as_simulated() -> SimResult:
    """The same history as the simulator's result objects: what its engine records of each attempt."""
    jobs, attempts = [], []
    for story in HISTORY:
        saved: int | None = None  # the job's newest checkpoint step
        for run in story.runs:
            last = max((at for at, _, _ in run.checkpoints), default=run.start)
            begun_at = run.restore[0] if run.restore else (saved or 0)
            attempts.append(
                AttemptResult(
                    job_id=story.name,
                    team="a",
                    outcome=run.outcome,
                    gpus=len(run.gpus),
                    busy_gpus=float(len(run.gpus)),
                    start_s=run.start,
                    end_s=run.end,
                    restore_s=run.restore[1] if run.restore else 0.0,
                    stall_s=run.stall_s,
                    lost_s=run.end - last,
                    resumed=saved is not None,
                    made_step=any(step > begun_at for _, step in run.steps),
                    price_per_hour=len(run.gpus) * PRICES[run.node],
                )
            )
            saved = max([step for _, step, _ in run.checkpoints], default=saved)
        first, finished = story.runs[0].start, story.runs[-1].end
        jobs.append(
            JobResult(
                story.name,
                "a",
                len(story.runs[0].gpus),
                0.0,
                story.submitted,
                first,
                finished,
                0.0,
                len(story.runs),
            )
        )
    return SimResult("replay", jobs, attempts, [], Totals(), 16, T0, NOW, 200.0, [(0.0, 0)])


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_one_history_gives_the_same_figures_on_the_platform_and_in_the_simulator(
    engine: Engine, settings: Settings, make_token: Callable[..., str]
) -> None:
    clock = Clock()
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(max_gpus_per_job=16, gpu_quota=16), clock())
    admin = make_token("ops", "platform-admin")
    with TestClient(create_app(settings, engine, fleet=FLEET, clock=clock)) as api:
        _replay_on_the_platform(engine, api, clock)
        # The heartbeat's new fields are checked like the others.
        refused = api.post(
            "/v1/attempts/x/heartbeat",
            json={"fencing_token": 1, "checkpoint_stall_s": -1.0},
            headers=bearer("s"),
        )
        assert refused.status_code == 422
        refused = api.post(
            "/v1/attempts/x/heartbeat",
            json={"fencing_token": 1, "restore": {"step": 1, "seconds": 2.0, "when": 3}},
            headers=bearer("s"),
        )
        assert refused.status_code == 422
        clock.at(NOW)
        served = api.get("/v1/metrics/summary", params={"hours": 1}, headers=bearer(admin)).json()
        scraped = api.get("/metrics").text
    with engine.connect() as conn:
        records, job_records = attempt_store.metric_records(conn, T0 - timedelta(hours=1))
    platform = platform_summarize(records, job_records, {}, PRICES, T0 + timedelta(seconds=NOW), T0)
    simulated = sim_summarize(_as_simulated())

    hour = 3600.0
    assert platform.leased_gpu_hours == pytest.approx(simulated.leased_gpu_h)
    assert platform.useful_gpu_hours == pytest.approx(simulated.useful_gpu_h)
    assert platform.lost_gpu_hours == pytest.approx(simulated.lost_gpu_h)
    assert platform.goodput == pytest.approx(simulated.goodput)
    assert platform.resumes == simulated.resumes
    assert platform.resume_success_share == pytest.approx(simulated.resume_success)
    assert platform.queue_wait_p50_s == pytest.approx(simulated.p50_wait_h * hour)
    assert platform.queue_wait_p99_s == pytest.approx(simulated.p99_wait_h * hour)
    assert platform.cost_total == pytest.approx(simulated.cost_usd)
    assert platform.cost_per_finished_job == pytest.approx(simulated.cost_per_job_usd)
    # And what they are, by hand (GPU-seconds): kept steps a 2,700 + 2,640, b 390 + 520, c 360, d 200;
    # lost a 5 x 4, b 140 x 2 and 20 x 2 (of its 70 s, 50 restored), c's FAILED 85 x 2; leased 7,860.
    assert platform.useful_gpu_hours == pytest.approx(6810 / hour)
    assert platform.lost_gpu_hours == pytest.approx(510 / hour)
    assert platform.goodput == pytest.approx(6810 / 7860)
    assert (platform.resumes, platform.resume_success_share) == (4, 0.75)  # b's second did not step
    assert (platform.queue_wait_p50_s, platform.queue_wait_p99_s) == (10.0, 810.0)
    assert platform.cost_total == pytest.approx(((1420 * 4 + 200) * 2.0 + (710 + 280) * 2 * 3.0) / hour)
    # The API serves the same summary, and Prometheus the same goodput.
    assert served["goodput"] == pytest.approx(platform.goodput)
    assert served["lost_gpu_hours"] == pytest.approx(platform.lost_gpu_hours)
    assert served["resume_success_share"] == 0.75
    (gauge,) = [line for line in scraped.splitlines() if line.startswith("gpuyard_goodput_ratio ")]
    assert float(gauge.split()[1]) == pytest.approx(platform.goodput)
