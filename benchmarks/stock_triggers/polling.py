"""The stock way to wait on a job from Airflow's triggerer, the baseline of trigger_followers.py.

PollingJobTrigger reads its job every `poll_s` seconds (2) until the job ends, one client per
trigger, as the Kubernetes provider's pod trigger reads its pod; it tells nothing on the way and
fires one event at the end. Measurement only: gpuyard's operator defers to GpuJobTrigger, which
follows every job through one shared long poll of the event log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from gpuyard_client import TERMINAL_STATES
from gpuyard_provider.hooks.gpuyard import GpuyardHook


class PollingJobTrigger(BaseTrigger):
    def __init__(self, *, job_id: str, poll_s: float = 2.0, gpuyard_conn_id: str = "gpuyard_default") -> None:
        super().__init__()
        self.job_id, self.poll_s, self.gpuyard_conn_id = job_id, poll_s, gpuyard_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job_id": self.job_id, "poll_s": self.poll_s, "gpuyard_conn_id": self.gpuyard_conn_id},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client = await GpuyardHook(self.gpuyard_conn_id).aget_conn()
        try:
            while True:
                job = await client.job(self.job_id)
                if job["state"] in TERMINAL_STATES:
                    break
                await asyncio.sleep(self.poll_s)
        finally:
            await client.aclose()
        yield TriggerEvent({"job_id": self.job_id, "state": job["state"], "reason": job.get("reason")})
