"""GpuJobTrigger: follows one gpuyard job through its events in Airflow's triggerer, until it ends.

It is serialized with the job id, the connection id (never the token: the triggerer reads the
connection itself), the event cursor it was deferred with and its task instance's key. Each event
becomes a line of the task's log (the triggerer writes trigger output there; see narration.py), and
the end of the job fires one TriggerEvent with its outcome.

Restarts: after each batch of events it writes its cursor to an XCom of its task instance
(`gpuyard_cursor`). A trigger started again (the triggerer restarted, or moved it) resumes from the
larger of that and the cursor it was deferred with, so a state change is told once and never lost.
On a user's mark-failed, clear or mark-success of the deferred task, `on_kill` cancels the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from airflow.sdk.execution_time.xcom import XCom
from airflow.triggers.base import BaseTrigger, TriggerEvent

from gpuyard.airflow.hooks.gpuyard import GpuyardHook
from gpuyard.airflow.narration import NEEDS_ATTEMPTS, TERMINAL_JOB_EVENTS, Story, summary
from gpuyard.airflow.triggers.followers import Followers
from gpuyard.client import TERMINAL_STATES, ApiError, AsyncGpuyardClient, Endpoint

CURSOR_XCOM = "gpuyard_cursor"


class GpuJobTrigger(BaseTrigger):
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
    ) -> None:
        super().__init__()
        self.job_id, self.cursor, self.gpuyard_conn_id = job_id, cursor, gpuyard_conn_id
        self.ti_key = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "cursor": self.cursor,
                "gpuyard_conn_id": self.gpuyard_conn_id,
                **self.ti_key,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        endpoint = await GpuyardHook(self.gpuyard_conn_id).aendpoint()
        cursor = max(self.cursor, await self._saved_cursor())
        self.log.info(f"gpuyard job {self.job_id}: following its events after #{cursor}")
        story = await self._recalled(endpoint, cursor)
        followers = Followers.of(endpoint)  # no await between this and follow(): the hub stays open
        job: dict[str, Any] | None = None
        async with aclosing(followers.follow(self.job_id, cursor)) as batches:
            async for batch in batches:
                if not batch:  # the backlog is told: the job may have ended while nobody followed
                    job = await followers.client.job(self.job_id)
                    if job["state"] in TERMINAL_STATES:
                        break
                    continue
                if any(event["type"] in NEEDS_ATTEMPTS for event in batch):
                    job = await followers.client.job(self.job_id)
                self._tell(story, batch, job)
                cursor = batch[-1]["seq"]
                await self._save_cursor(cursor)
                if any(event["type"] in TERMINAL_JOB_EVENTS for event in batch):
                    job = await followers.client.job(self.job_id)
                    break
        assert job is not None
        self.log.info(f"gpuyard {summary(job)}")
        yield TriggerEvent(
            {"job_id": job["id"], "state": job["state"], "reason": job.get("reason"), "cursor": cursor}
        )

    async def on_kill(self) -> None:
        client = AsyncGpuyardClient(await GpuyardHook(self.gpuyard_conn_id).aendpoint())
        try:
            await client.cancel(self.job_id)
            self.log.info(f"gpuyard job {self.job_id}: cancelled (the task was stopped by a user)")
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

    def _tell(self, story: Story, batch: list[dict[str, Any]], job: dict[str, Any] | None) -> None:
        for event in batch:
            line = story.tell(event, job)
            if line:
                self.log.info(f"gpuyard job {self.job_id} #{event['seq']}: {line}")

    # The cursor lives in an XCom of the task instance. The SDK's sync calls work from a worker
    # thread both in the triggerer and in `airflow dags test`, whose in-process comms have no async path.
    async def _saved_cursor(self) -> int:
        saved = await asyncio.to_thread(XCom.get_one, key=CURSOR_XCOM, **self.ti_key)
        return int(saved) if saved is not None else -1

    async def _save_cursor(self, cursor: int) -> None:
        await asyncio.to_thread(XCom.set, CURSOR_XCOM, cursor, **self.ti_key)
