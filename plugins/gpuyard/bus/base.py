"""The bus interface. Messages only point at state in the database; they never carry it.

Semantics every implementation keeps (the contract tests check them):
- a message published is delivered to every consumer group at least once;
- a delivered message stays pending for its consumer until acked;
- `reclaim` hands messages that a (dead) consumer held longer than `min_idle_s` to another one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuyard.domain.model import Event


class BusUnavailable(Exception):
    """The bus cannot be reached now; the caller retries later (the outbox keeps the events)."""


@dataclass(frozen=True)
class Message:
    event_seq: int
    type: str
    job_id: str
    attempt_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_event(cls, event: Event) -> Message:
        return cls(event.seq, event.type, event.job_id, event.attempt_id, dict(event.data))

    def encode(self) -> dict[str, str]:
        return {
            "seq": str(self.event_seq),
            "type": self.type,
            "job": self.job_id,
            "attempt": self.attempt_id or "",
            "data": json.dumps(self.data, separators=(",", ":")),
        }

    @classmethod
    def decode(cls, fields: dict[str, str]) -> Message:
        return cls(
            event_seq=int(fields["seq"]),
            type=fields["type"],
            job_id=fields["job"],
            attempt_id=fields["attempt"] or None,
            data=json.loads(fields["data"]),
        )


@dataclass(frozen=True)
class Delivery:
    id: str
    message: Message


class EventBus(Protocol):
    def publish(self, messages: Sequence[Message]) -> None: ...

    def ensure_group(self, group: str) -> None:
        """Create the group if missing; a new group starts at the oldest retained message."""

    def read(self, group: str, consumer: str, *, count: int = 100, block_s: float = 1.0) -> list[Delivery]:
        """New messages for this group, now pending for `consumer`; waits up to `block_s` for some."""
        ...

    def ack(self, group: str, ids: Sequence[str]) -> None: ...

    def reclaim(self, group: str, consumer: str, *, min_idle_s: float, count: int = 100) -> list[Delivery]:
        """Take over messages pending (unacked) for longer than `min_idle_s`, from any consumer."""
        ...

    def close(self) -> None: ...
