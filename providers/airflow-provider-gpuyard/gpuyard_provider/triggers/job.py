"""GpuJobTrigger: follows one gpuyard job through its events in Airflow's triggerer, until it ends.

It is serialized with the job id, the connection id (never the token: the triggerer reads the
connection itself), the event cursor it was deferred with and its task instance's key. Each batch
of events becomes one record of the task's log, a line per event (the triggerer writes trigger
output there; see narration.py), and the end of the job fires one TriggerEvent with its outcome.

Restarts: after each batch it tells, the trigger hands its cursor to its Followers hub, which
writes it to an XCom of the task instance (`gpuyard_cursor`) in the background, at most one write a
second for the whole process (each costs Airflow's supervisor a database round trip; a follower's
newer cursor replaces its older one while it waits). A trigger started again (the triggerer
restarted, or moved it) resumes from the larger of that and the cursor it was deferred with: no
state change is missed, and none told before its save is told again; what a crash caught between
telling and saving is told once more.
On a user's mark-failed, clear or mark-success of the deferred task, `on_kill` cancels the job.

Deadline: with `deadline` (epoch seconds: the task's start plus its `execution_timeout`, as the
operator computes it) the trigger stops following at that moment and fires a TIMED_OUT event; the
operator then cancels the job and fails the try. Airflow's own deferral timeout fails the task
without calling the operator, which would leave the job spending GPUs: the operator sets that one
past the deadline, a backstop for a trigger that never ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from airflow.sdk.execution_time.xcom import XCom
from airflow.triggers.base import BaseTrigger, TriggerEvent
from gpuyard_client import TERMINAL_STATES, ApiError, AsyncGpuyardClient, Endpoint

from gpuyard_provider.hooks.gpuyard import GpuyardHook
from gpuyard_provider.narration import TERMINAL_JOB_EVENTS, Story, tell_batch
from gpuyard_provider.triggers.followers import Followers

CURSOR_XCOM = "gpuyard_cursor"
TIMED_OUT = "TIMED_OUT"  # the event's state when the deadline passed before the job ended


class GpuJobTrigger(BaseTrigger):
    # Its records' logger name: every record's bytes cost Airflow's triggerer supervisor (followers.py)
    _logger_name = "gpuyard"

    def __init__(
        self,
        *,
        job_id: str,
        cursor: int,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: int = -1,
        gpuyard_conn_id: str = GpuyardHook.default_conn_name,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.job_id, self.cursor, self.gpuyard_conn_id = job_id, cursor, gpuyard_conn_id
        self.deadline = deadline
        self.ti_key = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "cursor": self.cursor,
                "gpuyard_conn_id": self.gpuyard_conn_id,
                "deadline": self.deadline,
                **self.ti_key,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        endpoint = await GpuyardHook(self.gpuyard_conn_id).aendpoint()
        self.cursor = max(self.cursor, await self._saved_cursor())
        story = await self._recalled(endpoint, self.cursor)
        self.log.info(f"gpuyard job {self.job_id}: following its events after #{self.cursor}")
        followers = Followers.of(endpoint)  # no await between this and follow(): the hub stays open
        left_s = None if self.deadline is None else self.deadline - time.time()
        try:
            async with asyncio.timeout(left_s):
                state, reason = await self._follow(followers, story)
        except TimeoutError:
            state, reason = TIMED_OUT, "the task's execution_timeout passed before the job ended"
            self.log.info(f"gpuyard job {self.job_id}: {reason}; the task cancels it")
        yield TriggerEvent({"job_id": self.job_id, "state": state, "reason": reason, "cursor": self.cursor})

    async def _follow(self, followers: Followers, story: Story) -> tuple[str, str | None]:
        """Tell the job's events after `self.cursor`, moving it, until the job ends: its outcome."""
        async with aclosing(followers.follow(self.job_id, self.cursor)) as batches:
            try:
                async for batch in batches:
                    if not batch:  # the backlog is told: the job may have ended while nobody followed
                        job = await followers.job(self.job_id)
                        if job["state"] in TERMINAL_STATES:  # ended while no trigger followed it
                            state, reason = job["state"], job.get("reason")
                            self.log.info(f"gpuyard {story.summary(self.job_id, state, reason)}")
                            return state, reason
                        continue
                    needed = any(story.needs_attempt(event) for event in batch)
                    job = await followers.job(self.job_id) if needed else None
                    lines = tell_batch(story, batch, job)
                    self.cursor = batch[-1]["seq"]
                    ended = next((e for e in batch if e["type"] in TERMINAL_JOB_EVENTS), None)
                    if ended is not None:
                        state = ended["type"].split(".", 1)[1].upper()
                        reason = (ended.get("data") or {}).get("reason")
                        lines.append(f"gpuyard {story.summary(self.job_id, state, reason)}")
                    # One record per batch: each wakes Airflow's supervisor loop, which reads its log
                    # socket 4 KiB a loop. Written in this tick, a page's records reach it together
                    # (`ainfo`, from executor threads, measured worse: p99 6.5 s against 4.5 s).
                    if lines:
                        self.log.info("\n".join(lines))
                    if ended is not None:
                        return state, reason
                    followers.save(self.ti_key, self.cursor, self._save_cursor)
            finally:
                followers.forget(self.ti_key)  # the trigger's event ends the deferral: nothing to save
        raise RuntimeError(f"gpuyard job {self.job_id}: its events stopped before it ended")

    async def on_kill(self) -> None:
        # Said before the request: the task's log may be closed by the time the answer comes (a line
        # written after it was lost once on a loaded machine, the job cancelled all the same).
        self.log.info(f"gpuyard job {self.job_id}: cancelling it (the task was stopped by a user)")
        client = AsyncGpuyardClient(await GpuyardHook(self.gpuyard_conn_id).aendpoint())
        try:
            await client.cancel(self.job_id)
            self.log.info(f"gpuyard job {self.job_id}: cancelled")
        except ApiError as error:
            if error.status != 409:  # 409: it already ended
                raise
        finally:
            await client.aclose()

    async def _recalled(self, endpoint: Endpoint, cursor: int) -> Story:
        """A story that knows the events up to `cursor`, told before a restart."""
        story = Story()
        if cursor <= 0:
            return story
        client = AsyncGpuyardClient(endpoint)
        try:
            seen = 0
            while seen < cursor:
                page = await client.events(job_id=self.job_id, after=seen, limit=1000)
                for event in page["events"]:
                    if event["seq"] <= cursor:
                        story.recall(event)
                if not page["events"]:
                    break
                seen = page["events"][-1]["seq"]
        finally:
            await client.aclose()
        return story

    # The cursor lives in an XCom of the task instance: through the triggerer's async comms, or the
    # SDK's sync call from a worker thread under `airflow dags test`, whose in-process comms have no
    # async path.
    async def _saved_cursor(self) -> int:
        saved = await asyncio.to_thread(XCom.get_one, key=CURSOR_XCOM, **self.ti_key)
        return int(saved) if saved is not None else -1

    async def _save_cursor(self, cursor: int) -> None:
        from airflow.sdk.execution_time import task_runner

        if hasattr(task_runner.SUPERVISOR_COMMS, "asend"):  # the triggerer's comms
            await XCom.aset(CURSOR_XCOM, cursor, **self.ti_key)
        else:
            await asyncio.to_thread(XCom.set, CURSOR_XCOM, cursor, **self.ti_key)
