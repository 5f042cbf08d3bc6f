"""The promises the control plane keeps whatever fails, checked over a whole campaign's history.

Pure: every check reads a `History` (tests/faults/history.py) and returns its violations. Orders
come from the store's event log (`seq`, one total order the database gave), never from timestamps
that processes with skewed clocks wrote; the workers' times are the machine's monotonic clock.

An attempt is live from the event that reserved it (`job.scheduled` naming it) to the event of its
end (`attempt.<succeeded|failed|preempted|lost|cancelled>`); its leases live exactly as long (they
are written and deleted in those transactions).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .history import FINAL_JOB_STATES, TERMINAL_ATTEMPT_EVENTS, AttemptRow, History, Record
from .workload import writes_journal

LIVE_ATTEMPT_STATES = {"CREATED", "LAUNCHING", "RUNNING"}
# How late the platform may notice an end: a lease period, half of one for a new leader to take over
# (the leader lease), and a few scheduler passes.
DETECTION_SLACK_S = 5.0
MEASURE_SLACK_S = 1.0  # a heartbeat's or an observation's own delay


@dataclass(frozen=True)
class Violation:
    invariant: str
    job_id: str | None
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.job_id or '-'}: {self.detail}"


Interval = tuple[int, float]  # (seq it began, seq it ended or infinity)


def live_intervals(history: History) -> dict[str, Interval]:
    """Each attempt's life in the event log's order."""
    began: dict[str, int] = {}
    ended: dict[str, int] = {}
    for event in history.events:
        if event.attempt_id is None:
            continue
        if event.type == "job.scheduled":
            began.setdefault(event.attempt_id, event.seq)
        elif event.type in TERMINAL_ATTEMPT_EVENTS:
            ended.setdefault(event.attempt_id, event.seq)
    for event in history.events:  # an attempt reserved without its event would still be counted
        if event.attempt_id in history.attempts:
            began.setdefault(event.attempt_id, event.seq)
    return {a: (began[a], ended.get(a, math.inf)) for a in history.attempts if a in began}


def _overlaps(intervals: Iterable[tuple[str, Interval]]) -> list[tuple[str, str]]:
    """Pairs of ids whose intervals overlap (sweep by start)."""
    found, open_until, holder = [], -math.inf, ""
    for name, (start, end) in sorted(intervals, key=lambda item: item[1]):
        if start < open_until:
            found.append((holder, name))
        if end > open_until:
            open_until, holder = end, name
    return found


def _records(history: History) -> dict[str, list[Record]]:
    """Rank 0's journal by attempt (rank 0 resumes and saves), in time order."""
    by_attempt: dict[str, list[Record]] = defaultdict(list)
    for record in sorted(history.journal, key=lambda r: r.t):
        if record.rank == 0:
            by_attempt[record.attempt].append(record)
    return by_attempt


def _attempts_of(history: History) -> dict[str, list[AttemptRow]]:
    by_job: dict[str, list[AttemptRow]] = defaultdict(list)
    for attempt in history.attempts.values():
        by_job[attempt.job_id].append(attempt)
    return {job: sorted(found, key=lambda a: a.number) for job, found in by_job.items()}


# -- the invariants --------------------------------------------------------------------------------

Finding = tuple[str | None, str]  # the job (None: the whole run) and what is wrong
Invariant = Callable[[History], Iterable[Finding]]
CHECKS: dict[str, Invariant] = {}


def invariant(name: str) -> Callable[[Invariant], Invariant]:
    """Register a check under the promise it keeps; it yields what breaks it."""

    def register(check: Invariant) -> Invariant:
        CHECKS[name] = check
        return check

    return register


def check(history: History) -> list[Violation]:
    return [Violation(name, job, detail) for name, run in CHECKS.items() for job, detail in run(history)]


@invariant("every accepted submission exists")
def accepted_submissions_exist(history: History) -> Iterator[Finding]:
    for submission in history.submissions:
        if submission.accepted and submission.job_id not in history.jobs:
            yield submission.job_id, f"key {submission.key}: not stored"
        if len(submission.ids) > 1:
            yield None, f"key {submission.key} answered {sorted(submission.ids)}"


@invariant("every job final")
def every_job_final(history: History) -> Iterator[Finding]:
    for job in history.jobs.values():
        if job.state not in FINAL_JOB_STATES:
            yield job.id, f"{job.state} after quiescence ({job.reason})"
    for a in history.attempts.values():
        if a.state in LIVE_ATTEMPT_STATES:
            yield a.job_id, f"attempt {a.number} still {a.state}"


@invariant("never two live attempts")
def never_two_live_attempts(history: History) -> Iterator[Finding]:
    intervals = live_intervals(history)
    for job_id, attempts in _attempts_of(history).items():
        for first, second in _overlaps((a.id, intervals[a.id]) for a in attempts if a.id in intervals):
            yield job_id, f"{first} {intervals[first]} and {second} {intervals[second]} (event seqs) overlap"


@invariant("no GPU leased twice")
def no_gpu_leased_twice(history: History) -> Iterator[Finding]:
    intervals = live_intervals(history)
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    for attempt in history.attempts.values():
        for gpu in attempt.gpus:
            holders[gpu].append(attempt.id)
    for (node, index), ids in sorted(holders.items()):
        for first, second in _overlaps((a, intervals[a]) for a in ids if a in intervals):
            seqs = f"seqs {intervals[first]}, {intervals[second]}"
            yield (
                history.attempts[second].job_id,
                f"{node} GPU {index}: {first} and {second} live at once ({seqs})",
            )


def _lapsed(records: list[Record], lease_s: float) -> bool:
    """Did the worker go a lease period without an answered heartbeat (a successor may own the job)?"""
    if any(r.e == "save_skipped" for r in records):
        return True
    marks = [r.t for r in records if r.e in ("resume", "beat", "exit")]  # records are in time order
    return any(later - earlier > lease_s - MEASURE_SLACK_S for earlier, later in itertools.pairwise(marks))


def _exit_codes(history: History) -> dict[str, dict[int, int]]:
    """How each attempt's workers exited, by rank: their shims' exit files, else (a full disk took the
    file) the code the worker itself reported last, unless a SIGKILL may have come between the
    worker's report and its shim's file: the suite's (seed 702: a node lost as its worker exited 0 is
    LOST, rightly) or the platform's own, at the end of the grace period of a stop it asked for (seed
    803: shims frozen as their workers exited 0, preempted meanwhile, killed at the thaw)."""
    stopped = {a.id for a in history.attempts.values() if a.stop_requested is not None}
    stopped |= set(history.disruptions)  # the cluster's SIGTERM may land in the worker's exit (seed 1014)
    codes: dict[str, dict[int, int]] = defaultdict(dict)
    for record in sorted(history.journal, key=lambda r: r.t):
        if record.e == "exit" and record.attempt not in history.kills and record.attempt not in stopped:
            codes[record.attempt][record.rank] = int(record.data["code"])
    for attempt_id, ranks in history.exits.items():
        codes[attempt_id].update(ranks)
    return codes


@invariant("attempts match exits")
def attempts_match_exits(history: History) -> Iterator[Finding]:
    journal, exit_codes = _records(history), _exit_codes(history)
    for job_id, attempts in _attempts_of(history).items():
        job = history.jobs.get(job_id)
        if job is None:
            continue
        numbers = [a.number for a in attempts]
        if numbers != list(range(1, job.attempt_count + 1)):
            yield job_id, f"attempt_count {job.attempt_count}, attempts numbered {numbers}"
        failed = [a for a in attempts if a.state == "FAILED"]
        uncounted = 1 if job.state == "CANCELLED" and attempts and attempts[-1].state == "FAILED" else 0
        if job.failures != len(failed) - uncounted and job.failures != len(failed):
            yield job_id, f"failures {job.failures}, but {len(failed)} attempts failed"
        if job.state == "FAILED" and job.failures != job.max_failures + 1:
            yield job_id, f"FAILED with {job.failures} failures (budget {job.max_failures})"
        if job.state == "SUCCEEDED" and (not attempts or attempts[-1].state != "SUCCEEDED"):
            last = attempts[-1].state if attempts else "missing"
            yield job_id, f"SUCCEEDED, but its last attempt is {last}"
        for attempt in attempts:
            codes = exit_codes.get(attempt.id, {})
            where = f"attempt {attempt.number} ({attempt.state})"
            if attempt.exit_code is not None and codes and attempt.exit_code not in codes.values():
                yield job_id, f"{where}: the store says exit {attempt.exit_code}, the workers exited {codes}"
            if attempt.state == "SUCCEEDED" and set(codes.values()) - {0}:
                yield job_id, f"{where}: SUCCEEDED, but the workers exited {codes}"
            all_zero = len(codes) >= len(attempt.gpus) and set(codes.values()) == {0}
            if (
                all_zero
                and attempt.state not in ("SUCCEEDED", "CANCELLED")
                and not _lapsed(journal.get(attempt.id, []), history.lease_s)
                and not _unheard_at_exit(history, attempt.id, journal.get(attempt.id, []))
            ):
                said = f"the store says {attempt.reason!r}"
                yield job_id, f"{where}: every worker exited 0 under a lease that held; {said}"
            asked = attempt.stop_requested is not None or attempt.id in history.disruptions  # an eviction
            if attempt.state == "PREEMPTED" and not asked:
                yield job_id, f"{where}: PREEMPTED, but neither the platform nor the cluster asked it to stop"


REPORT_SLACK_S = 2.0  # a node's agent reports a container's end within a pass or two


def _unheard_at_exit(history: History, attempt_id: str, records: list[Record]) -> bool:
    """Whether the node of a pod of the attempt was cut off (reporting nothing) when its worker
    exited, before that exit could be reported: the platform could not know it (seed 1114: a worker
    exited 0 as its node went NotReady; the lease ran out and the attempt was rightly LOST)."""
    exited = next((r.t for r in records if r.e == "exit"), None)
    spans = history.unheard.get(attempt_id, [])
    return exited is not None and any(
        start <= exited + REPORT_SLACK_S and end >= exited for start, end in spans
    )


def _recorded_before(history: History, job_id: str, seq: int) -> int | None:
    """The step of the newest checkpoint the store recorded for the job before event `seq`."""
    step = None
    for event in history.events:
        if event.seq >= seq:
            break
        if event.job_id == job_id and event.type == "attempt.checkpointed":
            step = int(event.data["step"])
    return step


def _durable_steps(
    history: History, job_id: str, *, before: float, other_than: str, maybe: bool = False
) -> list[int]:
    """Steps of the job's checkpoints that attempts other than `other_than` completed before `before`;
    `maybe`: those they were committing too (a worker killed between its commit and its `saved` record
    left a complete checkpoint the journal does not call complete)."""
    said = ("saved", "committing") if maybe else ("saved",)
    return [
        int(r.data["step"])
        for r in history.journal
        if r.e in said and r.job == job_id and r.attempt != other_than and r.t < before
    ]


@invariant("retries resume from the newest checkpoint")
def retries_resume_from_the_newest_checkpoint(history: History) -> Iterator[Finding]:
    """Each attempt resumed from the newest checkpoint the store had recorded when it was reserved
    (complete: `recorded_checkpoints_were_durable`); when the store had recorded none, from the newest
    one an earlier attempt had completed when it looked (a save whose report was lost)."""
    intervals, journal = live_intervals(history), _records(history)
    for attempt in history.attempts.values():
        resumed = next((r for r in journal.get(attempt.id, []) if r.e == "resume"), None)
        if resumed is None or attempt.id not in intervals:
            continue
        step = int(resumed.data["step"])
        recorded = _recorded_before(history, attempt.job_id, intervals[attempt.id][0])
        if recorded is not None:
            allowed, whose = {recorded}, f"the store's newest checkpoint was step {recorded}"
        else:  # a save that completed while it looked may or may not have been seen
            began = float(resumed.data.get("began", resumed.t))
            sure = max(
                _durable_steps(history, attempt.job_id, before=began, other_than=attempt.id), default=0
            )
            seen = _durable_steps(
                history, attempt.job_id, before=resumed.t, other_than=attempt.id, maybe=True
            )
            allowed = {s for s in [0, *seen] if s >= sure}
            whose = f"none was recorded, the newest durable one was step {sure}"
        if step not in allowed:
            yield attempt.job_id, f"attempt {attempt.number} resumed from step {step}; {whose}"
    for r in history.journal:
        if r.e == "recorded_incomplete":
            yield r.job, f"{r.attempt}: recorded {r.data['url']} is incomplete"


@invariant("recorded checkpoints were durable")
def recorded_checkpoints_were_durable(history: History) -> Iterator[Finding]:
    """Every checkpoint the store recorded for an attempt was completed by it, or is the one it resumed
    from, which an earlier attempt of the job completed: the runtime's heartbeat reports its newest
    durable checkpoint, the restored one until it saves (seed 501: a save completed, the attempt
    failed before reporting it, its successor resumed from it and reported it). A checkpoint an attempt
    was committing when it was killed, before its `saved` record, counts once a successor restored it:
    the runtime restores only a complete checkpoint (seed 603)."""
    saved = {(r.attempt, int(r.data["step"])) for r in history.journal if r.e == "saved"}
    completed = {(r.job, int(r.data["step"])) for r in history.journal if r.e in ("saved", "committing")}
    resumed = {(r.attempt, int(r.data["step"])) for r in history.journal if r.e == "resume"}
    for event in history.events:
        if event.type != "attempt.checkpointed":
            continue
        key = (event.attempt_id, int(event.data["step"]))
        if key not in saved and not (key in resumed and (event.job_id, key[1]) in completed):
            yield event.job_id, f"step {key[1]} recorded for {event.attempt_id}, which never completed it"


def _noticing_s(history: History, end: float) -> float:
    """How late the platform may notice an attempt that ended at `end`: a lease period and a half and a
    few passes; longer by every control-plane fault (`History.stalls`) that lasted past the end or
    struck before it was noticed, and by a leader's takeover (half a lease) after each."""
    allowed = history.lease_s * 1.5 + DETECTION_SLACK_S
    for start, stop in sorted(history.stalls):
        if stop < end - history.lease_s:
            continue  # healed a lease before the end: a new leader had taken over by then
        if start > end + allowed:
            break
        allowed += max(0.0, stop - max(start, end)) + history.lease_s / 2
    return allowed


@invariant("lost progress matches the workers")
def lost_progress_matches_workers(history: History) -> Iterator[Finding]:
    """The progress a preempted or lost attempt is charged (`progress_lost_s`: from its newest
    recorded checkpoint, or its start, to its end) agrees with the worker's own account: no less
    than the time from the answer that recorded that checkpoint to the worker's end, or to the
    platform's verdict where that came first (the store recorded the checkpoint before answering; a
    worker killed first got no answer; a lease that ran out on a worker still alive ends the attempt
    there, and what the worker did after is fenced off, not progress of it: seed 1020, a worker hung
    in a slow checkpoint store until its pod was deleted), no more than the time from
    its save to the end plus how late the platform may notice an end (`_noticing_s`: the charge runs
    until the GPUs were freed, which a paused or cut-off leader delays; seed 600's run), counted from
    when the pod's node was heard from again where it reported nothing at the end."""
    journal = _records(history)
    recorded: dict[str, int] = {}
    for event in history.events:
        if event.type == "attempt.checkpointed" and event.attempt_id is not None:
            recorded[event.attempt_id] = int(event.data["step"])
    for attempt in history.attempts.values():
        records = journal.get(attempt.id, [])
        if attempt.state not in ("PREEMPTED", "LOST") or attempt.progress_lost_s is None or not records:
            continue
        exited = next((r.t for r in records if r.e == "exit"), None)
        # A kill after its exit changes nothing; a worker the platform killed (SIGKILL at a grace
        # period's end) journals no exit: its shim's file says when it ended (seed 721). Killed with its
        # shim (frozen past the grace period, then the whole group), it left no time of its own: it
        # ended between its last record and its launcher's verdict (seed 766).
        known = exited or history.kills.get(attempt.id) or history.ended.get(attempt.id)
        end = known or records[-1].t
        latest_end = known or max(end, history.verdicts.get(attempt.id, end))
        step = recorded.get(attempt.id)
        if step is not None:
            save = next((r.t for r in records if r.e == "saved" and r.data["step"] == step), None)
            answer = next((r.t for r in records if r.e == "beat" and r.data.get("checkpoint") == step), end)
        else:
            save = records[0].t  # charged from its start
            answer = next((r.t for r in records if r.e == "beat"), end)
        if save is None:
            continue  # a checkpoint it never completed: recorded_checkpoints_were_durable says so
        stopped = end if attempt.ended_at is None else min(end, attempt.ended_at)
        low = max(0.0, stopped - answer) - MEASURE_SLACK_S
        # The platform cannot learn of an end while the pod's node reports nothing (a node lost until
        # its Node is deleted, a partition until it heals): its noticing starts when the node is heard
        # from again (seed 489215: a node lost, its Node deleted 8-24 s later, as a cloud's controller).
        heard = max(
            (stop for start, stop in history.unheard.get(attempt.id, []) if start <= latest_end <= stop),
            default=latest_end,
        )
        high = heard - save + _noticing_s(history, heard)
        if not low <= attempt.progress_lost_s <= high:
            charged = f"charged {attempt.progress_lost_s:.1f}s lost"
            says = f"its worker says between {low:.1f}s and {high:.1f}s"
            yield attempt.job_id, f"attempt {attempt.number} ({attempt.state}) {charged}; {says}"


FENCED = "fenced from committing"  # the store's word for a lost attempt whose workers may run on


def _fenced(attempt: AttemptRow) -> bool:
    """An attempt the platform ended LOST while its workers were out of reach (their pods on a node
    that stopped reporting): the guarantee there is that at most one attempt *commits*, so its
    successor may run beside it (docs/concepts.md, "What keeps an attempt alive")."""
    return attempt.state == "LOST" and FENCED in (attempt.reason or "")


@invariant("never two attempts running at once")
def never_two_attempts_running_at_once(history: History) -> Iterator[Finding]:
    """No two attempts of a job had workers alive at the same moment: an attempt's workers lived at
    least from their first journal record to their last (or to the suite's kill), and the platform
    starts a successor only once nothing of the attempt before can run, or (a fenced attempt) once
    nothing of it can commit: `fenced_attempts_commit_nothing` checks that one."""
    lives: dict[str, tuple[float, float]] = {}
    for record in history.journal:
        first, last = lives.get(record.attempt, (record.t, record.t))
        lives[record.attempt] = (min(first, record.t), max(last, record.t))
    for job_id, attempts in _attempts_of(history).items():
        spans = [(a.id, lives[a.id]) for a in attempts if a.id in lives]
        for first, second in _overlaps(spans):
            if _fenced(history.attempts[first]):
                continue
            overlap = lives[first][1] - lives[second][0]
            yield job_id, f"the workers of {first} still ran {overlap:.1f}s after those of {second} started"


def _late_saves(history: History) -> Iterator[tuple[AttemptRow, Record, float]]:
    """Each checkpoint an attempt completed after a later attempt of its job started, with how late."""
    starts = {r.attempt: r.t for r in sorted(history.journal, key=lambda r: -r.t) if r.e == "start"}
    for attempts in _attempts_of(history).values():
        for attempt in attempts:
            later = [starts[a.id] for a in attempts if a.number > attempt.number and a.id in starts]
            if not later:
                continue
            successor_start = min(later)
            for record in history.journal:
                if record.attempt == attempt.id and record.e == "saved" and record.t > successor_start:
                    yield attempt, record, record.t - successor_start


@invariant("no zombie writes")
def no_zombie_writes(history: History) -> Iterator[Finding]:
    """No attempt completes a checkpoint after a later attempt of its job has started (but a fenced
    one: `fenced_attempts_commit_nothing`)."""
    for attempt, record, late in _late_saves(history):
        if not _fenced(attempt):
            step = record.data["step"]
            yield (
                attempt.job_id,
                f"attempt {attempt.number} completed step {step} {late:.1f}s after a successor started",
            )


@invariant("fenced attempts commit nothing")
def fenced_attempts_commit_nothing(history: History) -> Iterator[Finding]:
    """An attempt that ran on beside its successor, fenced, committed nothing once it was lost: the
    store recorded no checkpoint of it after its end, and a checkpoint it completed after its
    successor started lies where no other attempt of the job saved or resumed from."""
    ended = {e.attempt_id: e.seq for e in history.events if e.type in TERMINAL_ATTEMPT_EVENTS}
    for event in history.events:
        attempt = history.attempts.get(event.attempt_id or "")
        late = attempt is not None and event.seq > ended.get(attempt.id, math.inf)
        if attempt is not None and late and _fenced(attempt) and event.type == "attempt.checkpointed":
            yield (
                attempt.job_id,
                f"attempt {attempt.number}: step {event.data['step']} recorded after its end",
            )
    users: dict[str, set[str]] = defaultdict(
        set
    )  # a checkpoint's URL -> the attempts that saved or resumed it
    for record in history.journal:
        if record.e in ("saved", "resume") and record.data.get("url"):
            users[str(record.data["url"])].add(record.attempt)
    for attempt, record, _ in _late_saves(history):
        url = str(record.data.get("url"))
        if _fenced(attempt) and users[url] - {attempt.id}:
            yield (
                attempt.job_id,
                f"attempt {attempt.number}, fenced, completed {url}, which another attempt uses",
            )


@invariant("no cancel lost")
def no_cancel_lost(history: History) -> Iterator[Finding]:
    cancelled = {c.job_id for c in history.cancels if c.status == 200}
    cancelled |= {job.id for job in history.jobs.values() if job.cancel_requested}
    for job_id in sorted(cancelled):
        if job_id in history.jobs and history.jobs[job_id].state != "CANCELLED":
            yield job_id, f"the cancel was accepted, the job ended {history.jobs[job_id].state}"


@invariant("no worker outlives its attempt")
def no_worker_outlives_its_attempt(history: History) -> Iterator[Finding]:
    for attempt_id, pids in sorted(history.leftovers.items()):
        attempt = history.attempts.get(attempt_id)
        state = attempt.state if attempt else "unknown to the store"
        job_id = attempt.job_id if attempt else None
        doing = history.stuck.get(attempt_id)
        yield (
            job_id,
            (
                f"{attempt_id}: processes {pids} still run after quiescence; the attempt is {state}"
                + (f"\n{doing}" if doing else "")
            ),
        )


@invariant("the journal covers the run")
def the_journal_covers_the_run(history: History) -> Iterator[Finding]:
    """The checks of what workers did read their journal, and an empty one passes them all (a worker
    that is not the suite's, a journal written elsewhere): it must hold rank 0's records of every
    attempt of the suite's worker that succeeded. (One killed before its first line may have none;
    plain commands write none.)"""
    if not history.journal and history.attempts:
        yield (
            None,
            (
                f"the workers' journal is empty after {len(history.attempts)} attempt(s): nothing the "
                "workers did can be checked"
            ),
        )
        return
    journal = _records(history)
    for attempt in history.attempts.values():
        if (
            attempt.state == "SUCCEEDED"
            and not journal.get(attempt.id)
            and attempt.job_id in history.jobs
            and writes_journal(history.jobs[attempt.job_id].name)
        ):
            yield (
                attempt.job_id,
                f"attempt {attempt.number} SUCCEEDED but its rank 0 wrote nothing to the journal",
            )


@invariant("no rank started twice")
def no_rank_started_twice(history: History) -> Iterator[Finding]:
    """Each rank of an attempt starts once. A second start is a relaunch (a paused replica launching
    an attempt again, after it ended, or a second set of workers): after a job's last attempt no
    successor's start would show it to the checks between attempts."""
    starts: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in history.journal:
        if record.e == "start":
            starts[(record.attempt, record.rank)].append(record.t)
    for (attempt_id, rank), times in sorted(starts.items()):
        if len(times) > 1:
            attempt = history.attempts.get(attempt_id)
            apart = max(times) - min(times)
            yield (
                attempt.job_id if attempt else None,
                (f"{attempt_id} rank {rank} started {len(times)} times, {apart:.1f}s apart: a relaunch"),
            )
