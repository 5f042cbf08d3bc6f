"""The scheduler service: the I/O edge around the pure cycle.

One loop, level-triggered like a Kubernetes controller: every pass applies what the launcher
observed (acknowledging each report once the store has it), renews the leases of attempts whose
workers the launcher sees alive, asks attempts to stop that must (cancelled, hung, out of time),
reaps expired leases, tends the checkpoint transfers under way, runs the cycle, reserves and
launches its placements (or, for a job placed away from its newest checkpoint, starts a transfer
instead: scheduler/mover.py copies it outside the passes), and signals every attempt asked to stop.
Bus messages only wake the loop early; a lost message costs a delay, never a job. Replicas elect
one leader by a lease row, judged by the database's clock and fenced by an epoch
(`store/leadership.py`). Every write of the scheduler confirms its lead in its own transaction, and
every side effect outside the store (a launch, a stop signal, a release) is made inside the fenced
transaction that records it: a replica whose lead passed writes nothing and starts nothing, and the
lead cannot change hands while a launch is under way, so the next leader's recovery sees each attempt
either launched (LAUNCHING) or not (CREATED, launched then by that recovery, once).

Work on one attempt runs inside `attempt_context`: every line logged meanwhile, the launcher's too,
carries its job_id and attempt_id as fields (observability/logs.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from gpuyard import metrics
from gpuyard.bus.base import BusUnavailable, EventBus
from gpuyard.clock import Clock, utcnow
from gpuyard.domain.checkpoint_roots import CheckpointStores, is_under, job_roots, join, roots_at, roots_for
from gpuyard.domain.fleet import Fleet
from gpuyard.domain.liveness import overdue
from gpuyard.domain.model import Attempt, Job
from gpuyard.domain.placement import Placement
from gpuyard.domain.sites import Wan, copy_deadline_s, transfer_s
from gpuyard.domain.states import AttemptState, JobState, StopReason
from gpuyard.launchers.base import LaunchBusy, Launcher, LaunchRequest, Outcome, WorkerReport
from gpuyard.memory import release_free_memory
from gpuyard.observability import logs
from gpuyard.scheduler import inputs
from gpuyard.scheduler.cycle import CycleResult, Placed, run_cycle
from gpuyard.scheduler.mover import CopyRules, Mover
from gpuyard.scheduler.policy import POLICIES, Policy
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob
from gpuyard.scheduler.waiting import CYCLE_CODES, WaitRecorder, copying_reason, reason_code, reasons
from gpuyard.store import attempts as attempt_store
from gpuyard.store import jobs as job_store
from gpuyard.store import leadership
from gpuyard.store import teams as team_store
from gpuyard.store import transfers as transfer_store
from gpuyard.store.leadership import Lead, NotLeading
from gpuyard.store.reservations import Reservation, reserve_batch
from gpuyard.store.specs import SpecCache
from gpuyard.store.transfers import CheckpointTransfer, TransferState

log = logging.getLogger(__name__)

GROUP = "scheduler"
RESUME_URL = "GPUYARD_RESUME_URL"  # where a retry resumes: the checkpoint the store recorded
REPORTS_PER_TRANSACTION = 100  # one commit per batch; the batch's jobs stay locked until it commits
RELEASE_MEMORY_EVERY_S = 30.0  # after a backlog's passes, the freed heap goes back (gpuyard/memory.py)
_OUTCOMES = {
    Outcome.SUCCEEDED: AttemptState.SUCCEEDED,
    Outcome.FAILED: AttemptState.FAILED,
    Outcome.PREEMPTED: AttemptState.PREEMPTED,
    Outcome.LOST: AttemptState.LOST,
}


def job_id_of(attempt_id: str) -> str:
    """The job of an attempt id: the store makes them `<job id>-a<number>-<hex>` (a job id may hold
    '-a' itself, so it is read from the right)."""
    return attempt_id.rsplit("-", 2)[0]


@contextmanager
def attempt_context(attempt_id: str, job_id: str | None = None) -> Iterator[None]:
    """Lines logged within carry the attempt's job_id and attempt_id fields."""
    with logs.context(job_id=job_id or job_id_of(attempt_id), attempt_id=attempt_id):
        yield


class SchedulerService:
    def __init__(
        self,
        engine: Engine,
        launcher: Launcher,
        fleet: Fleet | Callable[[], Fleet],
        *,
        api_url: Callable[[], str],
        policy: Policy = POLICIES["gpuyard"],
        clock: Clock = utcnow,
        lease_ttl_s: float = 60.0,
        grace_s: float = 30.0,
        holder: str | None = None,
        checkpoint_stores: Callable[[Fleet], CheckpointStores] | None = None,
        wan: Wan | None = None,
        copy_rules: CopyRules = CopyRules(),
        store_options: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        """`checkpoint_stores`: the platform's stores for a fleet (`Settings.checkpoint_stores`); by
        default its sites' own, with no default store and no roots required. `wan`: the link between
        the fleet's sites, by which a move's copy is estimated (`move_pays`, its deadline); None: moves
        are not charged (the `move` site rule is then `any`). `copy_rules`: a move's deadline and
        retries (settings `moves`). `store_options`: by site, the fsspec storage options its mover opens
        the site's checkpoint store with (settings `sites.<name>.checkpoint_store_options`)."""
        self.engine, self.launcher, self.policy = engine, launcher, policy
        self.checkpoint_stores = checkpoint_stores or Fleet.checkpoint_stores
        self.fleet_now: Callable[[], Fleet] = fleet if callable(fleet) else (lambda: fleet)
        self.api_url, self.clock, self.lease_ttl_s, self.grace_s = api_url, clock, lease_ttl_s, grace_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.lead: Lead | None = None  # this replica's lead while it has one
        self._lead_held_at: datetime | None = None  # when this replica last took or renewed it
        self._index: FleetIndex | None = None  # this scheduler's index of the fleet (`fleet_index`)
        self._renewed: dict[str, datetime] = {}  # attempt id -> when its launcher last renewed it
        self._signalled: set[str] = set()  # attempts whose stop request this process delivered
        self.waits = WaitRecorder(engine)  # why each job waits, for the API's /v1/queue
        # The specs of the jobs its passes read, validated once: swept after each pass, so what it
        # keeps is the pending and live jobs' (store/specs.py).
        self.specs = SpecCache()
        self.wan = wan
        self.mover = Mover(
            engine, clock, rules=copy_rules, hold_s=lease_ttl_s / 2, store_options=store_options
        )

    # -- one pass ----------------------------------------------------------------------------------

    def fleet_index(self) -> FleetIndex:
        """The index of the fleet now, kept from pass to pass and built again when the fleet changes
        (nodes come and go): what every cycle derives from the fleet alone is derived once."""
        fleet = self.fleet_now()
        if self._index is None or (self._index.fleet is not fleet and self._index.fleet != fleet):
            self._index = FleetIndex(fleet)
        return self._index

    def snapshot(self, now: datetime) -> tuple[list[PendingJob], ClusterState, dict[str, Job]]:
        """The cycle's inputs (`inputs`), without the transfers under way."""
        return self.inputs(now)[:3]

    def inputs(
        self, now: datetime
    ) -> tuple[list[PendingJob], ClusterState, dict[str, Job], dict[str, CheckpointTransfer]]:
        """The cycle's inputs: the queue but the jobs whose checkpoint is on its way to another site
        (they wait for it), the cluster, the WAN and the copies under way on it; every job of the queue
        by id; and the transfers under way by job."""
        with self.engine.connect() as conn:
            waiting, pending, state = inputs.read(conn, self.fleet_index(), now, self.specs)
            moving = {t.job_id: t for t in transfer_store.under_way(conn)}
            abandoned = transfer_store.abandoned_at(conn)
        state.wan = self.wan
        state.copies = dict(Counter((t.from_site, t.site) for t in moving.values()))
        # A move given up: the job's wait at its own site counts again from then.
        pending = [
            replace(job, queued_at=abandoned[job.id]) if job.id in abandoned else job
            for job in pending
            if job.id not in moving
        ]
        return pending, state, {job.id: job for job in waiting}, moving

    def schedule(self) -> CycleResult:
        now = self.clock()
        pending, state, by_id, moving = self.inputs(now)
        copies = dict(state.copies)  # the cycle's own placements do not count: they copy nothing yet
        result = run_cycle(pending, state, now, self.policy)
        moves = {p.job.id: t for p in result.placed if (t := self.move_of(by_id[p.job.id], p, copies, now))}
        # One transaction per batch of gangs, each all or nothing, each batch confirming the lead
        # (store/reservations.py); NotLeading stops the pass, keeping the batches committed before.
        staying = [p for p in result.placed if p.job.id not in moves]
        wanted = [Reservation(p.job.id, p.placement, p.borrowed) for p in staying]
        made = reserve_batch(self.engine, wanted, at=now, lease_ttl_s=self.lease_ttl_s, lead=self.lead)
        for placed, attempt in zip(staying, made, strict=True):
            if attempt is not None:  # None: another replica or a cancel got there first
                metrics.scheduler_placements.inc()
                self.launch(attempt, by_id[placed.job.id])
        for transfer in moves.values():
            self.start_move(transfer, by_id[transfer.job_id])
        copying = {job_id: copying_reason(t) for job_id, t in {**moving, **moves}.items() if job_id in by_id}
        self.waits.record({**reasons(result, by_id), **copying}, by_id, at=now, lead=self.lead)
        metrics.scheduler_evictions.inc(len(result.evicted))
        waiting = Counter(reason_code(text) for text in result.waiting.values())
        for code in CYCLE_CODES:
            metrics.scheduler_waiting.labels(code).set(waiting[code])
        for eviction in result.evicted:
            victim = eviction.attempt.attempt_id
            with attempt_context(victim):
                # The log is the platform's: it names the job making room, which the victim's team
                # is not told (the reason it is told is the rule's own).
                log.info("preempting attempt %s for job %s: %s", victim, eviction.for_job, eviction.reason)
                attempt_store.request_stop(
                    self.engine, victim, at=now, why=eviction.reason, kind=StopReason.PREEMPT, lead=self.lead
                )
        return result

    def fenced(self) -> AbstractContextManager[Connection]:
        """A transaction under this replica's lead (`leadership.fenced`), for a write and the side
        effect it records; a replica paused inside loses it after half a lease (the lead's period).
        The lead is renewed first when a third of its period has passed since the last renewal."""
        self.keep_lead()
        return leadership.fenced(self.engine, self.lead, now=self.clock(), hold_s=self.lease_ttl_s / 2)

    def keep_lead(self) -> bool:
        """Renew the lead once a third of its period has passed, between passes and in the middle of
        one: a pass (or a recovery) longer than the period would otherwise lose it half way, and under
        load every pass did, the lead passing from replica to replica with no pass completing. True
        while leading (False without a lead); NotLeading when the renewal finds it gone, or lapsed (a
        new epoch: in between nobody was sure to lead, and this pass's reads may be stale; the next
        pass recovers under it). Never inside a fenced transaction: the renewal writes the lease row
        that transaction holds."""
        if self.lead is None or self._lead_held_at is None:
            return self.lead is not None
        now = self.clock()
        if (now - self._lead_held_at).total_seconds() < self.lease_ttl_s / 6:
            return True
        renewed = leadership.hold(self.engine, "scheduler", self.holder, now=now, ttl_s=self.lease_ttl_s / 2)
        if renewed != self.lead:
            raise NotLeading(f"{self.holder}'s lead (epoch {self.lead.epoch}) passed during a pass")
        self._lead_held_at = now
        return True

    def move_of(
        self, job: Job, placed: Placed, copies: dict[tuple[str, str], int], now: datetime
    ) -> CheckpointTransfer | None:
        """The transfer a placement needs first: its job's newest checkpoint lies at another site, and
        its team keeps checkpoints at the placement's (else it resumes from where they are), into the
        job's folder under its team's root there, estimated over the WAN shared with the `copies`
        under way. None: it starts now, at no copy."""
        site = placed.placement.site
        if not job.checkpoint_url or job.checkpoint_site in (None, site):
            return None
        stores = self.checkpoint_stores(self.fleet_now())
        with self.engine.connect() as conn:
            configured = team_store.configured_checkpoint_roots(conn, job.team)
        destination = roots_at(job.team, site, configured, stores)
        if not destination:
            return None
        step_dir = job.checkpoint_url.rstrip("/").rsplit("/", 1)[-1]
        nbytes = job.checkpoint_bytes or 0
        estimate = 0.0
        if self.wan is not None and nbytes:
            sharing = copies.get((job.checkpoint_site, site), 0) + 1
            estimate = transfer_s(nbytes, self.wan, sharing=sharing)
        deadline = copy_deadline_s(
            estimate, self.mover.rules.deadline_factor, self.mover.rules.deadline_floor_s
        )
        return CheckpointTransfer(
            job_id=job.id,
            state=TransferState.COPYING,
            epoch=self.lead.epoch if self.lead else 0,
            source=job.checkpoint_url,
            destination=f"{join(destination[0], job.id)}/{step_dir}",
            from_site=job.checkpoint_site,
            site=site,
            step=job.checkpoint_step,
            bytes_total=nbytes,
            bytes_done=0,
            files={},
            estimate_s=estimate,
            started_at=now,
            deadline_at=now + timedelta(seconds=deadline),
            updated_at=now,
        )

    def start_move(self, transfer: CheckpointTransfer, job: Job) -> None:
        """Record the transfer under this replica's lead and hand it to the mover. The scheduler copies
        with its own credentials, so only from the job's own roots: a checkpoint elsewhere (a job stored
        before the rule) is refused, the transfer abandoned as it starts, and the job stays."""
        with logs.context(job_id=job.id):
            stores = self.checkpoint_stores(self.fleet_now())
            with self.fenced() as conn:
                if not transfer_store.start(conn, transfer):
                    return
                own = job_roots(
                    job.id,
                    job.spec,
                    roots_for(job.spec, team_store.configured_checkpoint_roots(conn, job.team), stores),
                )
                if not any(is_under(transfer.source, root) for root in own):
                    reason = (
                        f"{transfer.source} lies outside job {job.id}'s checkpoint roots {list(own)}: "
                        "not copied"
                    )
                    transfer_store.abandon(
                        conn, job.id, transfer.epoch, at=transfer.started_at, reason=reason
                    )
                    log.warning("checkpoint of job %s not moved: %s", job.id, reason)
                    return
            log.info(
                "moving job %s to site %s: copying its checkpoint %s (estimate %.1f s, deadline %s)",
                job.id,
                transfer.site,
                transfer.source,
                transfer.estimate_s,
                transfer.deadline_at.isoformat(),
            )
            self.mover.ensure(transfer, self.lead)

    def tend_transfers(self) -> None:
        """Each transfer under way: abandoned once past its deadline or once its job left the queue
        (the job then stays at its own site, its wait counting again), else copied by this replica's
        mover (a no-op while its thread runs)."""
        now = self.clock()
        with self.engine.connect() as conn:
            under_way = transfer_store.under_way(conn)
            jobs = {t.job_id: job_store.get(conn, t.job_id) for t in under_way}
        for transfer in under_way:
            job = jobs[transfer.job_id]
            if now >= transfer.deadline_at:
                why = (
                    f"past its deadline {transfer.deadline_at.isoformat(timespec='seconds')} "
                    f"({transfer.bytes_done} of {transfer.bytes_total} bytes landed)"
                )
            elif job is None or job.state != JobState.PENDING or job.cancel_requested:
                why = "its job left the queue"
            else:
                self.mover.ensure(transfer, self.lead)
                continue
            with logs.context(job_id=transfer.job_id), self.fenced() as conn:
                if transfer_store.abandon(conn, transfer.job_id, transfer.epoch, at=now, reason=why):
                    log.warning(
                        "transfer of job %s to site %s abandoned: %s", transfer.job_id, transfer.site, why
                    )

    def launch(self, attempt: Attempt, job: Job) -> None:
        """Start the workers of a reserved (CREATED) attempt, claimed in the transaction around the
        launcher's call: launched once, by the replica that leads while it happens."""
        with attempt_context(attempt.id, job.id):
            self._launch(attempt, job)

    def _launch(self, attempt: Attempt, job: Job) -> None:
        request = self.launch_request(attempt, job)
        nodes = ", ".join(s.node for s in request.placement.slices)
        log.info("launching attempt %d of job %s on %s", attempt.number, job.id, nodes)
        try:
            with self.fenced() as conn:
                if not attempt_store.claim_launch(conn, attempt.id, self.clock(), self.lease_ttl_s):
                    log.info(
                        "attempt %s is not CREATED any more, or its lease ran out: not launched", attempt.id
                    )
                    return
                try:
                    self.launcher.launch(request)
                except LaunchBusy:
                    raise  # nothing started: the claim is undone with the transaction
                except Exception as error:  # the cluster refused, or broke mid-way (any launcher, any error)
                    self.launcher.cancel(attempt.id, grace_s=0)  # whatever part of it did start
                    self.not_started(attempt, f"launch failed: {error}", conn)
        except LaunchBusy as busy:
            # A stuck process (a paused replica) holds it: the other launches go on, and this attempt
            # stays reserved, for that process to finish or for its lease to end it.
            log.warning("attempt %s not launched: %s", attempt.id, busy)

    def not_started(self, attempt: Attempt, reason: str, conn: Connection | None = None) -> None:
        """The attempt could not start. It counts as a failure, with the job's backoff: a cause that
        persists (a corrupt checkpoint, a refused pod) ends the job instead of retrying every pass.
        In `conn` (the launch's claim) when given, else under this replica's lead."""
        log.warning("attempt %s did not start: %s", attempt.id, reason)  # in the attempt's context
        if conn is not None:
            attempt_store.finish(conn, attempt.id, AttemptState.FAILED, at=self.clock(), reason=reason)
            return
        with self.fenced() as fenced:
            attempt_store.finish(fenced, attempt.id, AttemptState.FAILED, at=self.clock(), reason=reason)

    def launch_request(self, attempt: Attempt, job: Job) -> LaunchRequest:
        # Resume where the newest checkpoint is; before any, the spec's checkpoint root.
        checkpoint = job.spec.checkpoint.url if job.spec.checkpoint else None
        env: dict[str, str] = {}
        secret = attempt.attempt_secret
        if secret is None:  # cleared when an attempt ends; live attempts always have one
            raise ValueError(f"attempt {attempt.id} has no secret: it has ended, nothing may launch it")
        if job.checkpoint_url and job.spec.checkpoint:
            checkpoint = job.checkpoint_url.rstrip("/").rsplit("/", 1)[0]
            env[RESUME_URL] = job.checkpoint_url  # the newest durable one by the store, not by a listing
        return LaunchRequest(
            attempt_id=attempt.id,
            job_id=job.id,
            attempt_number=attempt.number,
            fencing_token=attempt.fencing_token,
            attempt_secret=secret,
            spec=job.spec,
            placement=Placement.from_json(attempt.placement),
            api_url=self.api_url(),
            checkpoint_url=checkpoint,
            env=env,
            launched_before=attempt.state != AttemptState.CREATED,
        )

    def apply(self, reports: list[WorkerReport]) -> None:
        """Record the reports in the store, a batch per transaction, then acknowledge to the launcher
        those recorded. A report the store could not take is not acknowledged: the launcher repeats it
        next pass (at least once)."""
        for start in range(0, len(reports), REPORTS_PER_TRANSACTION):
            self._apply_batch(reports[start : start + REPORTS_PER_TRANSACTION])

    def _apply_batch(self, reports: list[WorkerReport]) -> None:
        # Each report in a savepoint of its own: one the store refuses is left out, not the batch.
        recorded: list[tuple[WorkerReport, bool]] = []
        try:
            ids = [r.attempt_id for r in reports]
            with attempt_store.batch(self.engine, ids, lead=self.lead, now=self.clock()) as conn:
                for report in reports:
                    with attempt_context(report.attempt_id):
                        try:
                            with conn.begin_nested():
                                recorded.append((report, self._record(conn, report)))
                        except Exception:
                            log.exception(
                                "attempt %s: report %s not recorded; it comes again",
                                report.attempt_id,
                                report,
                            )
        except NotLeading:
            raise  # the pass stops: the next leader records them (the launcher repeats them)
        except Exception:
            log.exception(
                "%d report(s) not recorded: their transaction failed; they come again", len(reports)
            )
            return
        for report, ended in recorded:
            with attempt_context(report.attempt_id):
                if ended:
                    log.info(
                        "attempt %s ended %s: %s",
                        report.attempt_id,
                        report.outcome.value,
                        report.reason or f"exit code {report.exit_code}",
                        extra={"outcome": report.outcome.value, "exit_code": report.exit_code},
                    )
                metrics.scheduler_reports.labels(report.outcome.value).inc()
                self.launcher.acknowledge(report)

    @staticmethod
    def _record(conn: Connection, report: WorkerReport) -> bool:
        """One report in the batch's transaction; True when it ended the attempt."""
        if report.outcome == Outcome.RUNNING:
            attempt_store.mark_running_in(conn, report.attempt_id, report.at)
            return False
        return attempt_store.finish(
            conn,
            report.attempt_id,
            _OUTCOMES[report.outcome],
            at=report.at,
            exit_code=report.exit_code,
            reason=report.reason,
            disrupted=report.disrupted,
        )

    def renew(self) -> None:
        """Renew the leases of attempts whose workers the launcher sees alive (marked RUNNING) or
        starting with progress (still LAUNCHING), a third of a lease period apart: with the workers'
        own heartbeats, one of the two sources of liveness."""
        now = self.clock()
        alive, starting = self.launcher.alive(), self.launcher.starting()
        every = timedelta(seconds=self.lease_ttl_s / 3)

        def due(seen: Mapping[str, int]) -> dict[str, int]:
            return {
                a: t for a, t in seen.items() if a not in self._renewed or now - self._renewed[a] >= every
            }

        renewed = attempt_store.renew(
            self.engine, due(alive), at=now, lease_ttl_s=self.lease_ttl_s, lead=self.lead
        ) | attempt_store.renew(
            self.engine, due(starting), at=now, lease_ttl_s=self.lease_ttl_s, lead=self.lead, running=False
        )
        for attempt_id in renewed:
            self._renewed[attempt_id] = now
            metrics.scheduler_leases_renewed.inc()
        for attempt_id in set(self._renewed) - set(alive) - set(starting):
            del self._renewed[attempt_id]

    def request_stops(self) -> None:
        """Ask live attempts to stop that must: their job was cancelled, they hung, or ran out of time."""
        now = self.clock()
        with self.engine.connect() as conn:
            live = attempt_store.live(conn, self.specs)
        for item in live:
            with attempt_context(item.attempt.id, item.job.id):
                if item.job.cancel_requested:
                    why, kind = "job cancelled", StopReason.CANCEL
                elif (limit := overdue(item.job, item.attempt, now)) is not None:
                    kind, why = limit
                else:
                    continue
                attempt_store.request_stop(
                    self.engine, item.attempt.id, at=now, why=why, kind=kind, lead=self.lead
                )

    def deliver_stops(self) -> None:
        """Signal every live attempt asked to stop (by the cycle, a cancel, a limit or an admin): the
        workers get SIGTERM and `grace_s` to checkpoint. Once per attempt per process; a new leader
        delivers again, as a level-triggered controller would. A signal the launcher could not deliver
        (its site does not answer) is tried again next pass, and stops none of the others."""
        with self.engine.connect() as conn:
            asked = attempt_store.asked_to_stop(conn)
        self._signalled &= asked
        for attempt_id in sorted(asked - self._signalled):
            with attempt_context(attempt_id):
                try:
                    with self.fenced():
                        self.launcher.cancel(attempt_id, grace_s=self.grace_s)
                except NotLeading:
                    raise
                except Exception as error:  # its site does not answer, say: the others' go on
                    log.warning("attempt %s: stop not delivered (%s); again next pass", attempt_id, error)
                    continue
            self._signalled.add(attempt_id)

    def reap(self) -> None:
        """Attempts whose lease passed (neither their workers nor their launcher renewed it) are LOST,
        and their jobs go back to the queue, but only once nothing of them can run any more: two
        attempts of one job never run at the same moment."""
        now = self.clock()
        with self.engine.connect() as conn:
            expired = attempt_store.expired(conn, now)
        for attempt_id in expired:
            with attempt_context(attempt_id):
                self._reap(attempt_id, now)

    def _reap(self, attempt_id: str, now: datetime) -> None:
        """LOST once the old attempt is known stopped (the launcher released it) or fenced from
        committing: a worker that heartbeats (the training runtime) writes nothing once its lease
        lapsed, and its token is stale from this transaction on. A worker that never heartbeat (a
        plain command on a partitioned node) cannot be fenced: its attempt waits until its launcher
        knows it stopped, so two never run at once."""
        reason = "lease expired: neither its workers nor its launcher renewed it within the lease"
        with self.fenced() as conn:
            found = attempt_store.attempt(conn, attempt_id)
            if not self.launcher.release(attempt_id):
                if found is None or found.heartbeat_at is None:
                    log.warning(
                        "attempt %s: lease expired, but its workers may still run and cannot be fenced "
                        "(they never heartbeat); not replaced until they are known stopped",
                        attempt_id,
                    )
                    return
                reason += "; its workers may still run, fenced from committing (their token is stale)"
            if attempt_store.finish(
                conn, attempt_id, AttemptState.LOST, at=now, reason=reason, disrupted=True
            ):
                log.warning("attempt %s lost: %s", attempt_id, reason)
        metrics.scheduler_leases_reaped.inc()

    def recover(self) -> None:
        """On taking the lead (each new epoch: a replica that lost and regained it may have missed
        anything): adopt or clean up workers, then launch the attempts reserved but not launched. A
        CREATED attempt was never claimed for a launch (`_launch`), or its claim was undone with the
        transaction of a replica that stopped mid-launch: whatever of it exists is completed by its
        launch here, never taken for lost (`LaunchRequest.launched_before`)."""
        self._renewed.clear()
        self._signalled.clear()
        self.waits.forget()
        if self.lead is not None:  # the transfers under way are this epoch's now: its mover resumes them
            with self.fenced() as conn:
                adopted = transfer_store.adopt(conn, self.lead.epoch, at=self.clock())
            for transfer in adopted:
                self.mover.ensure(transfer, self.lead)
        with self.engine.connect() as conn:
            live = attempt_store.live(conn)
        self.apply(
            self.launcher.reconcile({i.attempt.id: self.launch_request(i.attempt, i.job) for i in live})
        )
        for item in live:
            if item.attempt.state == AttemptState.CREATED:
                self.launch(item.attempt, item.job)

    def hold_lead(self) -> bool:
        """Take or renew the lead; under each new epoch, recover (fenced by it) before anything else."""
        now = self.clock()
        lead = leadership.hold(self.engine, "scheduler", self.holder, now=now, ttl_s=self.lease_ttl_s / 2)
        self._lead_held_at = now if lead is not None else None
        if lead is not None and lead != self.lead:
            log.info("scheduler %s leads (epoch %d)", self.holder, lead.epoch)
            self.lead = lead
            try:
                self.recover()
            except BaseException:
                self.lead = None  # not leading until recovered: a failed recovery is retried
                raise
        self.lead = lead
        return lead is not None

    def step(self) -> None:
        for phase in (
            lambda: self.apply(self.launcher.observe()),
            self.renew,
            self.request_stops,
            self.reap,
            self.tend_transfers,
            self.schedule,
            self.deliver_stops,
        ):
            self.keep_lead()
            phase()
        self.specs.sweep()  # the specs of jobs this pass did not read (they ended, or wait out a backoff)

    # -- the loop ----------------------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event,
        *,
        bus: EventBus | None = None,
        interval_s: float = 1.0,
        observe_s: float = 0.25,
    ) -> None:
        """Until `stop`: lead (or wait to), and run a pass every `interval_s` or when an event arrives."""
        if bus is not None:
            try:
                bus.ensure_group(GROUP)
            except BusUnavailable:  # Redis away at start: the store is the truth; a read recreates it
                log.warning("bus unavailable at start; scheduling from the store until it is back")
        next_pass = next_release = 0.0
        while not stop.is_set():
            metrics.scheduler_loop.set_to_current_time()
            try:
                # Leading, the lead is renewed once a third of its period passed (`keep_lead`), not at
                # every turn of this loop: four writes a second were most of an idle scheduler's cost;
                # every write it makes meanwhile is fenced by the lead's epoch all the same.
                leading = self.keep_lead() if self.lead is not None else self.hold_lead()
                metrics.scheduler_leader.set(int(leading))
                if not leading:
                    stop.wait(min(interval_s, self.lease_ttl_s / 6))
                    continue
                woken = self._wait_for_events(bus, stop, observe_s)
                monotonic = time.monotonic()
                if woken or monotonic >= next_pass:
                    with metrics.scheduler_pass.time():
                        self.step()
                    next_pass = monotonic + interval_s
                    if monotonic >= next_release:
                        release_free_memory()
                        next_release = monotonic + RELEASE_MEMORY_EVERY_S
                else:
                    self.apply(self.launcher.observe())
                    self.renew()
            except NotLeading as lost:  # the lead passed during this pass: the next leader carries on
                log.warning("scheduler pass stopped: %s", lost)
                self.lead = None
            except Exception:  # the loop must outlive any one failure; the store stays the truth
                metrics.scheduler_pass_failures.inc()
                log.exception("scheduler pass failed; retrying")
                stop.wait(interval_s)
        self.mover.close()  # a copy under way ends with its file; the next leader resumes it

    def _wait_for_events(self, bus: EventBus | None, stop: threading.Event, wait_s: float) -> bool:
        if bus is None:
            stop.wait(wait_s)
            return False
        try:
            deliveries = bus.read(GROUP, self.holder, count=500, block_s=wait_s)
            deliveries += bus.reclaim(GROUP, self.holder, min_idle_s=60.0)
        except BusUnavailable:
            stop.wait(wait_s)
            return False
        if deliveries:
            bus.ack(GROUP, [d.id for d in deliveries])  # a wake-up only: the pass reads the store
        return bool(deliveries)
