"""The fault suite in `make test`: a bounded campaign against the real processes (slow), and the
invariant checker shown to catch each broken promise in a made-up history (fast).

The bounded campaign draws a random seed unless GPUYARD_FAULT_SEED=N names one; it is printed first,
then the counts and the `RESULT ...` line of `python -m tests.faults.run`, and
`python -m tests.faults.run --seed N --campaigns 1` (or GPUYARD_FAULT_SEED=N) replays it.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from servers import open_directory

from training import exit_codes

from . import faults
from . import run as runner
from .campaign import Campaign, Report, run_campaign
from .faults import FAULTS
from .history import AttemptRow, CancelRequest, EventRow, History, JobRow, Record, Submission
from .invariants import Violation, check, retries_resume_from_the_newest_checkpoint
from .kubernetes import KUBERNETES_FAULTS
from .workload import Client, Plan, plan

# -- the bounded campaign ---------------------------------------------------------------------------


# Each launcher's bounded campaign: the cluster's pods start slower than local processes, so its
# campaign is shorter (issue 36: at most 60 s; alone, 33-50 s on eight seeds across two machines,
# against 80 s with a 25 s window). Job arrivals are random: the local one's floor below holds for
# all but a rare draw; the cluster's draws fewer (a draw of 15 s had at most one job 6 times in
# 100) and is topped up to three. Faults strike past the window (at most as long again) until two
# did: in a short one on a loaded machine most kinds may find no pod running yet (seed 757247: one
# fault in 25 s).
CAMPAIGNS = {
    "local": {"fault_s": 50.0, "min_faults": 2, "rate_per_s": 0.3, "quiesce_s": 150.0},
    "kubernetes": {"fault_s": 15.0, "min_faults": 2, "rate_per_s": 0.3, "min_jobs": 3, "quiesce_s": 150.0},
}


# The local campaign runs for minutes inside the suite and starts first (tests/suite_scheduling.py).
# The cluster's does not: at the start it shares the two cores with the other starts_first stacks,
# each of many processes (82 s there, against 35 s alone); among the single-process tests after
# them it gets the larger share.
STARTS_FIRST = {"local"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(name, marks=pytest.mark.starts_first if name in STARTS_FIRST else ())
        for name in sorted(CAMPAIGNS)
    ],
)
def test_a_bounded_fault_campaign_keeps_every_promise(
    launcher: str, capsys: pytest.CaptureFixture[str], record_property: Callable[[str, object], None]
) -> None:
    # A random seed each run (issue 28 item 11), printed before anything starts, so a failing draw is
    # replayed with GPUYARD_FAULT_SEED=N; each run of make test thus covers another schedule.
    chosen = os.environ.get("GPUYARD_FAULT_SEED", "random")
    seed = random.SystemRandom().randrange(1_000_000) if chosen == "random" else int(chosen)
    # A directory every user may enter: the cluster's pods run their workers as a user of their own.
    with capsys.disabled(), open_directory("gpuyard-faults-") as work:
        print(
            f"\nfault campaign seed {seed} on the {launcher} launcher (GPUYARD_FAULT_SEED={seed} replays it)"
        )
        report = run_campaign(Campaign(seed=seed, launcher=launcher, **CAMPAIGNS[launcher]), work, echo=print)
        print(report.render())
        result = runner.result_line(len(report.violations) + len(report.rejected), report.injected, launcher)
        print(result)
    # Under pytest-xdist a worker's output never reaches the terminal: the summary prints these.
    record_property("summary", f"fault campaign seed {seed} ({launcher}): {result}")  # tests/conftest.py
    assert sum(report.injected.values()) >= 2, "the campaign injected almost no faults"
    # A floor against a campaign that ran nothing, not a figure: a random draw heavy in database delays
    # submits fewer jobs (seed 851734: 9 in 50 s under a loaded suite, every promise kept).
    assert sum(report.jobs.values()) >= 2, "the campaign ran almost no jobs"
    assert not report.rejected, report.rejected
    assert not report.violations, "\n".join(map(str, report.violations))


def test_the_runner_ends_with_a_result_line_naming_every_kind_of_its_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake(campaign: Campaign, work: Path, echo: object) -> Report:
        report = Report(campaign, work / f"seed-{campaign.seed}")
        report.injected.update({"kill-relay": 2, "pause-leader": 1})
        report.violations = [Violation("no cancel lost", "j1", "made up")] if campaign.seed == 8 else []
        return report

    monkeypatch.setattr(runner, "run_campaign", fake)
    assert runner.main(["--seed", "7", "--campaigns", "2", "--work", str(tmp_path)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("RESULT violations=1 faults=6 kinds=")
    kinds = dict(pair.split(":") for pair in last.split("kinds=")[1].split(","))
    assert kinds["kill-relay"] == "4" and kinds["pause-leader"] == "2" and kinds["flush-redis"] == "0"
    assert set(kinds) == set(FAULTS)
    on_kubernetes = ["--launcher", "kubernetes", "--work", str(tmp_path)]
    assert runner.main(["--seed", "9", "--campaigns", "1", *on_kubernetes]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    kinds = dict(pair.split(":") for pair in last.split("kinds=")[1].split(","))
    assert set(kinds) == set(KUBERNETES_FAULTS) and kinds["lose-node"] == "0" and "full-disk" not in kinds


def test_a_campaign_strikes_with_every_kind_before_it_repeats_one() -> None:
    """The deck: a seeded order, each kind once per round; a kind that found nothing to act on is
    dealt again later in the round, not lost from it."""
    struck: list[str] = []
    stop = threading.Event()
    idle = {"kill-worker"}  # finds no attempt the first time it is dealt

    def fault(kind: str) -> Callable[[object, random.Random], str | None]:
        def strike(target: object, rng: random.Random) -> str | None:
            if kind in idle:
                idle.discard(kind)
                return None
            struck.append(kind)
            if len(struck) == 2 * len(FAULTS):
                stop.set()
            return "done"

        return strike

    kinds = {kind: fault(kind) for kind in FAULTS}

    def deal(seed: int) -> list[str]:
        struck.clear()
        stop.clear()
        idle.add("kill-worker")
        injector = faults.Injector(
            None,  # type: ignore[arg-type]
            seed,
            until=float("inf"),
            echo=lambda _: None,
            gap_s=(0, 0),
            kinds=kinds,
        )
        injector.run(stop)
        assert injector.injected == {kind: 2 for kind in FAULTS}
        return list(struck)

    first = deal(5)
    assert sorted(first[: len(FAULTS)]) == sorted(FAULTS) == sorted(first[len(FAULTS) :])
    assert first == deal(5) and first != deal(6)


def test_past_its_window_a_campaign_strikes_until_its_floor_and_no_more() -> None:
    kinds = {kind: (lambda target, rng: "done") for kind in FAULTS}
    now = time.monotonic()
    for at_least in (0, 2):
        injector = faults.Injector(
            None,  # type: ignore[arg-type]
            1,
            until=now,  # the window closed with nothing struck
            began=now - 60,
            echo=lambda _: None,
            gap_s=(0, 0),
            kinds=kinds,
            at_least=at_least,
        )
        injector.run(threading.Event())
        assert sum(injector.injected.values()) == at_least
    late = faults.Injector(
        None,  # type: ignore[arg-type]
        1,
        until=now - 60,
        began=now - 120,
        echo=lambda _: None,
        gap_s=(0, 0),
        kinds=kinds,
        at_least=2,
    )
    late.run(threading.Event())
    assert not late.injected  # as long again after the window, it gives up


def test_an_undone_campaign_s_client_gives_up_its_retries_at_once() -> None:
    """The API gone (the campaign interrupted, its servers stopped): a submission that retries toward
    a deadline an hour away ends as soon as the campaign's stop is set."""
    from servers import free_port

    stop = threading.Event()
    planned = Plan("k", "light", 0.0, {})
    client = Client(
        f"http://127.0.0.1:{free_port()}", "t", [planned], give_up_at=time.monotonic() + 3600, stop=stop
    )
    submitting = threading.Thread(target=client._submit, args=(planned,))
    submitting.start()
    submitting.join(1.0)
    assert submitting.is_alive()  # retrying: nothing answers
    stop.set()
    submitting.join(5.0)
    assert not submitting.is_alive()
    assert not client.submissions["k"].accepted  # no answer came: nothing recorded as accepted


def test_a_seed_plans_the_same_workload(tmp_path: Path) -> None:
    first = plan(7, duration_s=60, rate_per_s=0.4, run=tmp_path, lease_s=10)
    assert first == plan(7, duration_s=60, rate_per_s=0.4, run=tmp_path, lease_s=10)
    assert first != plan(8, duration_s=60, rate_per_s=0.4, run=tmp_path, lease_s=10)
    assert {p.kind for p in first} == {"resumer", "runtime", "long", "gang", "failing", "plain"}


def test_a_sparse_draw_is_topped_up_and_a_full_one_is_left_as_drawn(tmp_path: Path) -> None:
    def drawn(seed: int, **extra: int) -> list[Plan]:
        return plan(seed, duration_s=15, rate_per_s=0.3, run=tmp_path, lease_s=10, **extra)

    sparse = next(seed for seed in range(1000) if len(drawn(seed)) <= 1)
    topped = drawn(sparse, min_jobs=3)
    assert len(topped) == 3 and all(p in topped for p in drawn(sparse))
    assert [p.at_s for p in topped] == sorted(p.at_s for p in topped) and max(p.at_s for p in topped) < 15
    full = next(seed for seed in range(1000) if len(drawn(seed)) >= 3)
    assert drawn(full, min_jobs=3) == drawn(full)  # the seed's workload, as without the floor


# -- the checker, on made-up histories ----------------------------------------------------------------

GPU_A, GPU_B = ("node-a", 0), ("node-a", 1)


class Story:
    """A small history built event by event, as the store would log it."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRow] = {}
        self.attempts: dict[str, AttemptRow] = {}
        self.events: list[EventRow] = []
        self.journal: list[Record] = []
        self.exits: dict[str, dict[int, int]] = {}
        self.t = 100.0

    def event(self, type_: str, job: str, attempt: str | None = None, **data: object) -> None:
        self.events.append(EventRow(len(self.events) + 1, type_, job, attempt, dict(data)))

    def record(self, e: str, attempt: str, **data: object) -> None:
        self.t += 1.0
        self.journal.append(Record(e, attempt, self.attempts[attempt].job_id, 0, self.t, dict(data)))

    def job(self, job: str, state: str = "SUCCEEDED", failures: int = 0, max_failures: int = 2) -> None:
        count = sum(a.job_id == job for a in self.attempts.values())
        self.jobs[job] = JobRow(job, state, failures, count, False, max_failures, f"key-{job}", job)

    def attempt(self, job: str, number: int, state: str, gpu: tuple[str, int] = GPU_A, **row: object) -> str:
        attempt = f"{job}-a{number}"
        self.attempts[attempt] = AttemptRow(attempt, job, number, state, (gpu,), **row)  # type: ignore[arg-type]
        return attempt

    def history(self, **extra: object) -> History:
        return History(
            self.jobs,
            self.attempts,
            self.events,
            self.journal,
            self.exits,
            **extra,  # type: ignore[arg-type]
        )


def clean_story() -> Story:
    """j1 is preempted after a checkpoint at step 5, resumes from it and succeeds; j2 then uses the GPU."""
    s = Story()
    first = s.attempt(
        "j1", 1, "PREEMPTED", stop_requested="preempt", exit_code=exit_codes.PREEMPTED, progress_lost_s=1.5
    )
    second = s.attempt("j1", 2, "SUCCEEDED", exit_code=exit_codes.SUCCESS)
    other = s.attempt("j2", 1, "SUCCEEDED", exit_code=exit_codes.SUCCESS)
    s.event("job.submitted", "j1")
    s.event("job.scheduled", "j1", first)
    s.record("start", first)
    s.record("resume", first, step=0)
    s.record("beat", first, checkpoint=None)
    s.record("saved", first, step=5)
    s.record("beat", first, checkpoint=5)
    s.event("attempt.checkpointed", "j1", first, step=5)
    s.event("attempt.stop_requested", "j1", first, kind="preempt")
    s.record("exit", first, code=exit_codes.PREEMPTED)
    s.event("attempt.preempted", "j1", first)
    s.event("job.pending", "j1", first)
    s.event("job.scheduled", "j1", second)
    s.record("start", second)
    s.record("resume", second, step=5)
    s.record("exit", second, code=0)
    s.event("attempt.succeeded", "j1", second)
    s.event("job.submitted", "j2")
    s.event("job.scheduled", "j2", other)
    s.record("start", other)
    s.record("resume", other, step=0)
    s.record("exit", other, code=0)
    s.event("attempt.succeeded", "j2", other)
    s.exits = {first: {0: 75}, second: {0: 0}, other: {0: 0}}
    s.job("j1")
    s.job("j2")
    return s


def test_a_clean_history_breaks_no_promise() -> None:
    history = clean_story().history(
        submissions=[Submission("key-j1", "resumer", "j1", True, {"j1"})], lease_s=10.0
    )
    assert check(history) == []


def violated(history: History) -> set[str]:
    return {v.invariant for v in check(history)}


def test_the_checker_catches_a_lost_submission_and_a_second_job_for_one_key() -> None:
    story = clean_story()
    history = story.history(
        submissions=[
            Submission("k", "resumer", "gone", True, {"gone"}),
            Submission("k2", "resumer", "j1", True, {"j1", "j2"}),
        ]
    )
    assert [v.detail for v in check(history)] == ["key k: not stored", "key k2 answered ['j1', 'j2']"]


def test_the_checker_catches_a_job_left_unfinished() -> None:
    story = clean_story()
    story.jobs["j2"] = replace(story.jobs["j2"], state="PENDING")
    assert violated(story.history()) == {"every job final"}


def test_the_checker_catches_two_live_attempts_of_a_job_and_a_gpu_leased_twice() -> None:
    story = clean_story()
    # j1's second attempt reserved before the first one's end was logged: on the same GPU, too.
    scheduled = next(e for e in story.events if e.type == "job.scheduled" and e.attempt_id == "j1-a2")
    story.events.remove(scheduled)
    story.events.insert(2, EventRow(2, scheduled.type, scheduled.job_id, scheduled.attempt_id, {}))
    story.events = [
        EventRow(i + 1, e.type, e.job_id, e.attempt_id, e.data) for i, e in enumerate(story.events)
    ]
    assert violated(story.history()) >= {"never two live attempts", "no GPU leased twice"}


def test_the_checker_catches_an_outcome_lost_and_a_preemption_nobody_asked_for() -> None:
    story = clean_story()
    story.attempts["j2-a1"] = AttemptRow("j2-a1", "j2", 1, "LOST", (GPU_B,))  # its worker exited 0
    story.attempts["j1-a1"] = AttemptRow(
        "j1-a1", "j1", 1, "PREEMPTED", (GPU_A,), exit_code=exit_codes.PREEMPTED
    )
    details = [v.detail for v in check(story.history()) if v.invariant == "attempts match exits"]
    assert details == [
        "attempt 1 (PREEMPTED): PREEMPTED, but neither the platform nor the cluster asked it to stop",
        "SUCCEEDED, but its last attempt is LOST",
        "attempt 1 (LOST): every worker exited 0 under a lease that held; the store says None",
    ]
    history = story.history()
    history.disruptions["j1-a1"] = 1.0  # its pod evicted: the cluster asked
    details = [v.detail for v in check(history) if v.invariant == "attempts match exits"]
    assert not [d for d in details if "PREEMPTED" in d]


def j2_lost_as_its_worker_exited_0() -> Story:
    """The clean story, but j2's first attempt LOST with no shim status after its worker journaled exit
    0, and a second attempt that succeeded."""
    story = clean_story()
    story.attempts["j2-a1"] = replace(story.attempts["j2-a1"], state="LOST", exit_code=None)
    story.exits.pop("j2-a1")
    story.job("j2", state="SUCCEEDED")
    story.attempt("j2", 2, "SUCCEEDED", gpu=GPU_B, exit_code=exit_codes.SUCCESS)
    story.event("job.scheduled", "j2", "j2-a2")
    story.event("attempt.succeeded", "j2", "j2-a2")
    story.job("j2")
    return story


def test_a_worker_killed_with_its_shim_as_it_exited_0_is_rightly_lost() -> None:
    """Seed 702: the suite's kill-worker (a node losing the processes) struck as j2's worker journaled
    exit 0 and before its shim wrote the status: LOST is the truth then, not a lost outcome."""
    story = j2_lost_as_its_worker_exited_0()
    exit_record = next(r for r in story.journal if r.attempt == "j2-a1" and r.e == "exit")
    found = {v.detail for v in check(story.history()) if v.invariant == "attempts match exits"}
    assert "attempt 1 (LOST): every worker exited 0 under a lease that held; the store says None" in found
    killed = story.history(kills={"j2-a1": exit_record.t})
    assert not [v for v in check(killed) if v.invariant == "attempts match exits"]


def test_a_worker_the_platform_killed_after_its_stop_s_grace_as_it_exited_0_is_rightly_lost() -> None:
    """Seed 803: j2's workers journaled exit 0, their shims were frozen before writing the status, the
    platform preempted the attempt meanwhile and SIGKILLed it at the end of the grace period: no status
    survived, LOST is what the platform can know."""
    story = j2_lost_as_its_worker_exited_0()
    found = {v.detail for v in check(story.history()) if v.invariant == "attempts match exits"}
    assert "attempt 1 (LOST): every worker exited 0 under a lease that held; the store says None" in found
    story.attempts["j2-a1"] = replace(story.attempts["j2-a1"], stop_requested="preempt")
    assert not [v for v in check(story.history()) if v.invariant == "attempts match exits"]


def test_the_checker_catches_a_failure_count_that_disagrees_with_the_exits() -> None:
    story = clean_story()
    story.job("j2", state="SUCCEEDED", failures=1)
    assert [v.detail for v in check(story.history())] == ["failures 1, but 0 attempts failed"]


def test_the_checker_catches_a_retry_that_did_not_resume_from_the_newest_checkpoint() -> None:
    story = clean_story()
    resume = next(r for r in story.journal if r.attempt == "j1-a2" and r.e == "resume")
    story.journal[story.journal.index(resume)] = Record("resume", "j1-a2", "j1", 0, resume.t, {"step": 0})
    assert [v.detail for v in check(story.history())] == [
        "attempt 2 resumed from step 0; the store's newest checkpoint was step 5"
    ]


def test_without_a_recorded_checkpoint_a_retry_resumes_from_the_newest_durable_one() -> None:
    story = clean_story()  # the report of j1's checkpoint was lost: the store recorded none
    story.events = [e for e in story.events if e.type != "attempt.checkpointed"]
    assert list(retries_resume_from_the_newest_checkpoint(story.history())) == []
    resume = next(r for r in story.journal if r.attempt == "j1-a2" and r.e == "resume")
    story.journal[story.journal.index(resume)] = Record("resume", "j1-a2", "j1", 0, resume.t, {"step": 0})
    assert [detail for _, detail in retries_resume_from_the_newest_checkpoint(story.history())] == [
        "attempt 2 resumed from step 0; none was recorded, the newest durable one was step 5"
    ]


def test_the_checker_catches_a_checkpoint_recorded_but_never_completed() -> None:
    story = clean_story()
    story.journal = [r for r in story.journal if r.e != "saved"]
    assert "recorded checkpoints were durable" in violated(story.history())


def test_a_recorded_checkpoint_may_be_the_one_an_attempt_resumed_from() -> None:
    """Seed 501: j1's first attempt completed step 5 and failed before reporting it; the second resumed
    from it and the runtime's first heartbeat reported it (its newest durable checkpoint)."""
    story = clean_story()
    story.events = [e for e in story.events if e.type != "attempt.checkpointed"]
    story.event("attempt.checkpointed", "j1", "j1-a2", step=5)
    assert "recorded checkpoints were durable" not in violated(story.history())
    story.journal = [r for r in story.journal if not (r.e == "saved" and r.attempt == "j1-a1")]
    assert "recorded checkpoints were durable" in violated(story.history())  # nobody completed it


def test_a_checkpoint_killed_between_its_commit_and_its_record_counts_once_a_successor_restored_it() -> None:
    """Seed 603: j1's first attempt was killed after the rename that completed step 5 and before its
    `saved` record; the second restored step 5 (complete on disk) and reported it. A `committing`
    record nobody restored proves nothing: a restore from it is what shows it complete."""
    story = clean_story()
    story.events = [e for e in story.events if e.type != "attempt.checkpointed"]
    story.event("attempt.checkpointed", "j1", "j1-a2", step=5)
    story.attempts["j1-a1"] = replace(story.attempts["j1-a1"], progress_lost_s=5.0)  # from its start
    saved = next(r for r in story.journal if r.e == "saved" and r.attempt == "j1-a1")
    story.journal[story.journal.index(saved)] = replace(saved, e="committing")
    assert violated(story.history()) == set()
    story.journal = [r for r in story.journal if r.e != "committing"]
    assert violated(story.history()) == {
        "recorded checkpoints were durable",
        "retries resume from the newest checkpoint",
    }


def test_the_checker_catches_lost_progress_charged_wrong() -> None:
    story = clean_story()
    story.attempts["j1-a1"] = replace(story.attempts["j1-a1"], progress_lost_s=120.0)
    assert violated(story.history(lease_s=10.0)) == {"lost progress matches the workers"}


def lost_after_its_checkpoint(charged_s: float) -> History:
    """j1's first attempt lost 2 s after its checkpoint (the journal's clock: saved at 104, the
    worker killed at 106, no exit of its own), charged `charged_s` of lost progress."""
    story = clean_story()
    story.attempts["j1-a1"] = replace(
        story.attempts["j1-a1"], state="LOST", stop_requested=None, exit_code=None, progress_lost_s=charged_s
    )
    story.exits.pop("j1-a1")
    story.journal = [r for r in story.journal if not (r.attempt == "j1-a1" and r.e == "exit")]
    story.events = [e for e in story.events if e.type != "attempt.stop_requested"]
    return story.history(lease_s=10.0, kills={"j1-a1": 106.0})


def test_a_loss_noticed_late_because_the_leader_was_paused_is_charged_until_it_was_noticed() -> None:
    """Seed 600: j1's first attempt was lost 2 s after its checkpoint (the journal's clock: saved at
    104, the worker's end at 106) while the leader was paused for 14 s; the store charged it until the
    standby noticed, 30 s after the save. Within the bound only because the checker knows the pause."""
    lost = lost_after_its_checkpoint(charged_s=30.0)
    assert violated(lost) == {"lost progress matches the workers"}  # 30 > 2 + 15 + 5
    assert violated(replace(lost, stalls=[(105.0, 119.0)])) == set()  # + 13 + 5: 40


def test_a_loss_on_a_node_that_reported_nothing_is_charged_until_it_could_be_known() -> None:
    """Seed 489215 (emulated cluster): a node lost 2 s after j1's checkpoint, its Node deleted 22 s
    later (a cloud's controller: 8-24 s); the platform may not end the attempt before its pods are
    gone, and charged it 35 s. Within the bound only because the checker knows the node was unheard."""
    lost = lost_after_its_checkpoint(charged_s=35.0)
    assert violated(lost) == {"lost progress matches the workers"}  # 35 > 2 + 15 + 5
    assert violated(replace(lost, unheard={"j1-a1": [(106.0, 128.0)]})) == set()  # 24 + 15 + 5: 44


def test_a_worker_the_platform_killed_in_its_start_is_charged_until_its_shim_saw_it_end() -> None:
    """Seed 721: a runtime worker still importing torch when its preemption came (its only record:
    `start`), SIGKILLed at the grace period's end 27 s into its attempt; the checker took its one
    record for its end. The shim's exit file says when it ended."""
    story = clean_story()
    start = next(r for r in story.journal if r.attempt == "j1-a1" and r.e == "start")
    story.journal = [r for r in story.journal if r.attempt != "j1-a1" or r.e == "start"]
    story.events = [e for e in story.events if e.type != "attempt.checkpointed"]
    story.attempts["j1-a1"] = replace(story.attempts["j1-a1"], exit_code=-9, progress_lost_s=27.3)
    story.exits["j1-a1"] = {0: -9}
    unknown_end = story.history(lease_s=10.0)
    assert violated(unknown_end) >= {"lost progress matches the workers"}  # as if it ended at its start
    seen_end = replace(unknown_end, ended={"j1-a1": start.t + 27.0})
    assert "lost progress matches the workers" not in violated(seen_end)


def test_a_worker_killed_with_its_shim_is_charged_until_its_launchers_verdict_at_most() -> None:
    """Seed 766 of issue 28's fifth 60-minute run: a runtime worker frozen with its shim (pause-worker)
    through its preemption's grace period, then killed with it: no exit, no exit file; the checker
    took its one record for its end. It ended before its launcher recorded the verdict."""
    story = clean_story()
    start = next(r for r in story.journal if r.attempt == "j1-a1" and r.e == "start")
    story.journal = [r for r in story.journal if r.attempt != "j1-a1" or r.e == "start"]
    story.events = [e for e in story.events if e.type != "attempt.checkpointed"]
    story.attempts["j1-a1"] = replace(story.attempts["j1-a1"], exit_code=None, progress_lost_s=27.3)
    story.exits.pop("j1-a1", None)
    unknown_end = story.history(lease_s=10.0)
    assert violated(unknown_end) >= {"lost progress matches the workers"}  # as if it ended at its start
    verdict = replace(unknown_end, verdicts={"j1-a1": start.t + 27.5})
    assert "lost progress matches the workers" not in violated(verdict)
    overcharged = replace(
        verdict,
        attempts={**verdict.attempts, "j1-a1": replace(verdict.attempts["j1-a1"], progress_lost_s=80.0)},
    )
    assert violated(overcharged) >= {"lost progress matches the workers"}  # bounded by the verdict


def test_a_lease_run_out_on_a_live_worker_is_charged_until_the_platform_s_verdict() -> None:
    """Seed 1020 on the emulated cluster: a worker hung in a slow checkpoint store's upload 1 s after
    its checkpoint's answer; its lease ran out and the platform ended the attempt LOST 22 s later,
    then deleted its pod, whose end the watcher saw 28.3 s after that answer. The checker wanted the
    charge to reach the pod's end; what a worker does after its attempt ended is not its progress."""
    story = clean_story()
    answer = next(r for r in story.journal if r.attempt == "j1-a1" and r.e == "beat" and r.data["checkpoint"])
    story.journal = [r for r in story.journal if not (r.attempt == "j1-a1" and r.e == "exit")]
    story.exits.pop("j1-a1")
    story.events = [e for e in story.events if e.type != "attempt.stop_requested"]
    lost = replace(
        story.attempts["j1-a1"], state="LOST", stop_requested=None, exit_code=None, progress_lost_s=22.6
    )
    story.attempts["j1-a1"] = lost
    pod_gone = story.history(lease_s=10.0, ended={"j1-a1": answer.t + 28.3})
    assert violated(pod_gone) == {"lost progress matches the workers"}  # as if it ran on to the pod's end
    verdict = {**pod_gone.attempts, "j1-a1": replace(lost, ended_at=answer.t + 22.0)}
    assert violated(replace(pod_gone, attempts=verdict)) == set()
    undercharged = {**verdict, "j1-a1": replace(verdict["j1-a1"], progress_lost_s=12.0)}
    assert violated(replace(pod_gone, attempts=undercharged)) == {"lost progress matches the workers"}


def test_the_checker_catches_a_zombie_that_runs_and_writes_after_its_successor_started() -> None:
    story = clean_story()
    story.record("saved", "j1-a1", step=6)  # after j1-a2's start
    assert violated(story.history()) >= {"no zombie writes", "never two attempts running at once"}


def test_a_fenced_zombie_may_run_beside_its_successor_but_commits_nothing() -> None:
    """Seed 1112 on the emulated cluster: a worker stuck 50 s in an upload on a node that went NotReady;
    its lease ran out and the platform, unable to know it stopped, ended it LOST "fenced from
    committing" and started its successor, which saved step 10; then the zombie completed step 10.
    That is the guarantee on a node out of reach (at most one attempt commits): the checker allows
    the overlap when the zombie's late save landed where no other attempt reads or writes."""
    story = clean_story()
    fenced = "lease expired: ...; its workers may still run, fenced from committing (their token is stale)"
    story.attempts["j1-a1"] = replace(
        story.attempts["j1-a1"], state="LOST", stop_requested=None, exit_code=None, reason=fenced
    )
    story.exits.pop("j1-a1")
    story.journal = [r for r in story.journal if not (r.attempt == "j1-a1" and r.e == "exit")]
    story.events = [e for e in story.events if e.type != "attempt.stop_requested"]
    story.record("saved", "j1-a1", step=6, url="file:///ck/step-000006-t1")  # after j1-a2's start
    own_folder = story.history(lease_s=10.0)
    assert "never two attempts running at once" not in violated(own_folder)
    assert not violated(own_folder) & {"no zombie writes", "fenced attempts commit nothing"}
    resumed = next(r for r in story.journal if r.attempt == "j1-a2" and r.e == "resume")
    story.journal.append(replace(resumed, data={"step": 5, "url": "file:///ck/step-000006-t1"}))
    assert "fenced attempts commit nothing" in violated(story.history(lease_s=10.0))  # another read it
    unfenced = replace(story.attempts["j1-a1"], reason="lease expired")
    story.attempts["j1-a1"] = unfenced
    assert violated(story.history()) >= {"no zombie writes", "never two attempts running at once"}


def test_an_exit_its_node_never_reported_may_end_as_lost() -> None:
    """Seed 1114 on the emulated cluster: a worker exited 0 just as its node went NotReady; the exit
    was never reported, the lease ran out and the platform rightly ended the attempt LOST (a second
    attempt then resumed from its last checkpoint and exited 0 at once). The checker knows the node
    was cut off when the worker exited."""
    s = Story()
    first = s.attempt("j1", 1, "LOST", reason="lease expired: ...; fenced from committing")
    second = s.attempt("j1", 2, "SUCCEEDED", exit_code=exit_codes.SUCCESS)
    s.event("job.submitted", "j1")
    s.event("job.scheduled", "j1", first)
    s.record("start", first)
    s.record("resume", first, step=0)
    s.record("beat", first, checkpoint=None)
    s.record("exit", first, code=0)
    exited = s.t
    s.event("attempt.lost", "j1", first)
    s.event("job.scheduled", "j1", second)
    s.record("start", second)
    s.record("resume", second, step=0)
    s.record("exit", second, code=0)
    s.event("attempt.succeeded", "j1", second)
    s.exits = {first: {0: 0}, second: {0: 0}}
    s.job("j1")
    heard = s.history(lease_s=10.0)
    assert violated(heard) == {"attempts match exits"}  # as far as it knows, the platform lost an exit 0
    assert violated(replace(heard, unheard={first: [(exited + 0.01, exited + 14.5)]})) == set()
    assert violated(replace(heard, unheard={first: [(exited + 5.0, exited + 14.5)]})) == {
        "attempts match exits"
    }


def test_the_checker_fails_on_an_empty_journal_or_a_success_it_has_no_record_of() -> None:
    story = clean_story()
    story.journal = []
    (empty,) = [v for v in check(story.history()) if v.invariant == "the journal covers the run"]
    assert "journal is empty after 3 attempt(s)" in empty.detail
    story = clean_story()
    story.journal = [r for r in story.journal if r.attempt != "j2-a1"]
    assert violated(story.history()) == {"the journal covers the run"}


def test_the_checker_catches_a_relaunch_after_the_last_attempt_ended() -> None:
    """A paused replica resumes and launches j2's only attempt again after it succeeded: no successor
    follows, so only the second start shows it."""
    story = clean_story()
    story.record("start", "j2-a1")
    story.record("resume", "j2-a1", step=0)
    assert violated(story.history()) == {"no rank started twice"}


def test_the_checker_catches_a_lost_cancel_and_a_leftover_worker() -> None:
    history = clean_story().history(
        cancels=[CancelRequest("j1", 200, "RUNNING")], leftovers={"j2-a1": [4242]}
    )
    assert violated(history) == {"no cancel lost", "no worker outlives its attempt"}
