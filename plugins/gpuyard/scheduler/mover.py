"""The mover: copies the checkpoints of jobs moving to another site, outside the scheduling passes.

A pass that places a job at another site than its newest checkpoint reserves nothing there: it
records a transfer (store/transfers.py, owned by the lead's epoch) and hands it to the mover, which
copies it in a thread of its own while passes go on. The copy resumes from the files the store
records as verified at the destination, retries what may pass (a failed request, a copy that does
not read back alike) with exponential backoff (tenacity) until its deadline, and gives up what
cannot (a source missing or not matching its own manifest). Every file landed, the landing and a
giving up are written under the lead the transfer was started or adopted with, and only while the
transfer is still that epoch's: once another replica leads (and adopted it), this copier's next
write raises NotLeading or finds the transfer gone, and it stops. Once landed, the copy is the job's
newest checkpoint, and a later pass places the job at its site like any other: the GPUs there are
reserved only then. Each site's store is opened with its own storage options (its endpoint and
credentials: settings `sites.<name>.checkpoint_store_options`), a site without any through the
environment.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tenacity
from sqlalchemy import Connection, Engine

from gpuyard.checkpoint_transfer import Copied, Corrupt, Landed, TransferError, copy_checkpoint
from gpuyard.clock import Clock
from gpuyard.observability import logs
from gpuyard.store import leadership
from gpuyard.store import transfers as transfer_store
from gpuyard.store.leadership import Lead, NotLeading
from gpuyard.store.transfers import CheckpointTransfer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyRules:
    """How long a move's copy may take, and how it retries (settings `moves`)."""

    deadline_factor: float = 3.0  # the deadline: this many times the scheduler's estimate of the copy
    deadline_floor_s: float = 600.0  # and at least this long
    attempts: int = 5  # tries of one copy, each resuming where the last stopped
    backoff_s: float = 2.0  # the first wait between tries, doubling up to a minute

    def __post_init__(self) -> None:
        if self.deadline_factor < 1 or self.deadline_floor_s <= 0 or self.attempts < 1 or self.backoff_s < 0:
            raise ValueError(
                "copy rules: deadline_factor >= 1, deadline_floor_s > 0, attempts >= 1 and backoff_s >= 0, "
                f"got {self}"
            )


class Gone(Exception):
    """The transfer is not this copier's any more (adopted by another epoch, abandoned): it stops."""


Copy = Callable[..., Copied]  # checkpoint_transfer.copy_checkpoint's signature


class Mover:
    """Runs the transfers of this replica's lead, one thread each, started by `ensure`."""

    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        *,
        rules: CopyRules,
        hold_s: float,
        store_options: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        """`store_options`: the fsspec storage options of each site's checkpoint store, by site."""
        self.engine, self.clock, self.rules, self.hold_s = engine, clock, rules, hold_s
        self.store_options: Mapping[str, Mapping[str, Any]] = store_options or {}
        self.copy: Copy = copy_checkpoint
        self._threads: dict[tuple[str, int], threading.Thread] = {}
        self._closed = threading.Event()  # interrupts a wait between tries

    def ensure(self, transfer: CheckpointTransfer, lead: Lead | None) -> None:
        """Copy `transfer` under `lead` unless a thread of this mover does already."""
        key = (transfer.job_id, transfer.epoch)
        thread = self._threads.get(key)
        if thread is not None and thread.is_alive():
            return
        self._threads = {k: t for k, t in self._threads.items() if t.is_alive()}
        thread = threading.Thread(
            target=self._run, args=(transfer, lead), name=f"transfer-{transfer.job_id}", daemon=True
        )
        self._threads[key] = thread
        thread.start()

    def copying(self) -> set[str]:
        """The jobs whose checkpoints this mover's threads are copying now."""
        return {job_id for (job_id, _), thread in self._threads.items() if thread.is_alive()}

    def close(self, timeout_s: float = 0.0) -> None:
        """Stop waiting between tries, and wait up to `timeout_s` for the threads (a copy under way
        ends with its current file; its next write finds whether it still leads)."""
        self._closed.set()
        for thread in list(self._threads.values()):
            thread.join(timeout_s)

    def _write(self, lead: Lead | None, write: Callable[[Connection], bool]) -> None:
        """`write` under `lead` (NotLeading once it passed); Gone when the transfer is not its any more."""
        with leadership.fenced(self.engine, lead, now=self.clock(), hold_s=self.hold_s) as conn:
            if not write(conn):
                raise Gone

    def _run(self, transfer: CheckpointTransfer, lead: Lead | None) -> None:
        job_id, epoch = transfer.job_id, transfer.epoch
        with logs.context(job_id=job_id):
            try:
                copied = self._copy(transfer, lead)
                details: dict[str, Any] = {
                    "files": copied.files,
                    "bytes": copied.bytes,
                    "sent_bytes": copied.copied_bytes,
                    "sha256": copied.sha256,
                }
                self._write(
                    lead,
                    lambda conn: transfer_store.land(conn, job_id, epoch, at=self.clock(), details=details),
                )
                log.info(
                    "checkpoint of job %s landed at site %s: %s", job_id, transfer.site, transfer.destination
                )
            except (NotLeading, Gone):
                log.info("transfer of job %s: no longer this replica's (epoch %d); stopped", job_id, epoch)
            except TransferError as error:
                reason = f"copy failed: {error}"
                log.warning("transfer of job %s abandoned: %s", job_id, reason)
                with contextlib.suppress(NotLeading, Gone):  # another leader owns it now, and decides
                    self._write(
                        lead,
                        lambda conn: transfer_store.abandon(
                            conn, job_id, epoch, at=self.clock(), reason=reason
                        ),
                    )
            except Exception:  # a thread must not die silently; the next leader resumes it
                log.exception(
                    "transfer of job %s failed unexpectedly; it resumes under the next lead", job_id
                )

    def _copy(self, transfer: CheckpointTransfer, lead: Lead | None) -> Copied:
        landed = dict(transfer.files)  # grows as files land: a retry resumes after them

        def on_file(file: Landed) -> None:
            self._write(
                lead,
                lambda conn: transfer_store.record_file(
                    conn,
                    transfer.job_id,
                    transfer.epoch,
                    name=file.name,
                    sha256=file.sha256,
                    done=file.bytes_done,
                    total=file.bytes_total,
                    at=self.clock(),
                ),
            )
            landed[file.name] = file.sha256

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.rules.attempts)
            | (lambda state: self.clock() >= transfer.deadline_at or self._closed.is_set()),
            wait=tenacity.wait_exponential(multiplier=self.rules.backoff_s, max=60.0),
            retry=tenacity.retry_if_exception(
                lambda error: isinstance(error, TransferError) and not isinstance(error, Corrupt)
            ),
            sleep=self._closed.wait,
            before_sleep=lambda state: log.warning(
                "transfer of job %s: try %d failed (%s); resuming",
                transfer.job_id,
                state.attempt_number,
                state.outcome.exception() if state.outcome else None,
            ),
            reraise=True,
        )
        copied: Copied = retrying(
            self.copy,
            transfer.source,
            transfer.destination,
            landed=landed,
            on_file=on_file,
            tag=str(transfer.epoch),
            source_options=self.store_options.get(transfer.from_site),
            destination_options=self.store_options.get(transfer.site),
        )
        return copied
