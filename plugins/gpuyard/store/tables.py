"""The schema, as SQLAlchemy Core tables. Alembic migrations under migrations/ create it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator

metadata = MetaData()


class UtcDateTime(TypeDecorator[datetime]):
    """Timestamps are UTC-aware in Python on every database (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("gpuyard stores aware datetimes only")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
SeqId = BigInteger().with_variant(Integer(), "sqlite")

teams = Table(
    "teams",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("max_gpus_per_job", Integer, nullable=False),
    Column("allowed_gpu_types", JSON, nullable=False),
    Column("gpu_quota", Integer, nullable=False),
    Column("cohort", String(63)),
    Column("weight", Float, nullable=False, server_default=text("1.0")),
    # The team's admission policy (domain/admission.py); empty lists allow everything.
    Column("allowed_registries", JSON, nullable=False, server_default=text("'[]'")),
    Column("require_digest", Boolean, nullable=False, server_default=text("false")),
    Column("allowed_priorities", JSON, nullable=False, server_default=text("'[]'")),
    Column("checkpoint_roots", JSON, nullable=False, server_default=text("'{}'")),  # site -> [root]
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("secret_hash", String(64), nullable=False),
    Column("team", String(63), ForeignKey("teams.name"), nullable=False),
    Column("role", String(32), nullable=False),
    Column("description", String(200), nullable=False, server_default=""),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Column("last_used_at", UtcDateTime()),  # updated at most once a minute
    Column("revoked_at", UtcDateTime()),
)

jobs = Table(
    "jobs",
    metadata,
    Column("seq", SeqId, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("team", String(63), ForeignKey("teams.name"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("spec_hash", String(64), nullable=False),
    Column("idempotency_key", String(255)),
    Column("state", String(16), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("failures", Integer, nullable=False, server_default=text("0")),
    Column("attempt_count", Integer, nullable=False, server_default=text("0")),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    Column("reason", Text),
    Column("not_before", UtcDateTime()),  # retry backoff: not scheduled before this
    Column("attained_gpu_s", Float, nullable=False, server_default=text("0")),
    Column("progress_lost_gpu_s", Float, nullable=False, server_default=text("0")),
    Column("checkpoint_url", Text),  # newest durable checkpoint of any attempt: where a retry resumes
    Column("checkpoint_step", BigInteger),
    Column("checkpoint_site", String(63)),
    Column("checkpoint_cost_s", Float),  # measured, for the Young/Daly interval
    Column("checkpoint_bytes", BigInteger),  # its size, as its worker reported it: a move's estimate
    Column("first_started_at", UtcDateTime()),  # max_runtime counts from here, across attempts
    Column("created_by", String(32), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    UniqueConstraint("team", "idempotency_key", name="uq_jobs_team_idempotency_key"),
    Index("ix_jobs_state_priority", "state", "priority", "seq"),
    Index("ix_jobs_team_seq", "team", "seq"),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", String(48), primary_key=True),
    Column("job_id", String(40), ForeignKey("jobs.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    # The worker's proof of its attempt on heartbeats (domain/attempt_secret.py): set at reservation,
    # kept so any replica can launch the attempt, NULL once it has ended. Never in a response or event.
    Column("attempt_secret", String(64)),
    Column("placement", JSON, nullable=False),
    Column("exit_code", Integer),
    Column("reason", Text),
    Column("step", BigInteger),
    Column("checkpoint_url", Text),
    Column("checkpoint_step", BigInteger),
    Column("checkpoint_at", UtcDateTime()),
    Column("stop_requested", String(32)),  # checkpoint_and_stop: preemption or cancel asked it to stop
    Column("borrowed", Boolean, nullable=False, server_default=text("false")),
    Column("started_at", UtcDateTime()),
    Column("ended_at", UtcDateTime()),
    Column("heartbeat_at", UtcDateTime()),
    # The attempt's lease: renewed by its workers' heartbeats and by its launcher while it sees them
    # alive; the reaper ends the attempt LOST once it has passed. Its GPU leases carry the same expiry.
    Column("lease_expires_at", UtcDateTime()),
    Column("progress_at", UtcDateTime()),  # when `step` last advanced: hang detection
    Column("progress_lost_s", Float),
    # The accounting's (docs/metrics.md): the checkpoint step it resumes from (its job's newest when
    # reserved, then the one its workers report restoring), the seconds they report spending on that
    # restore and on checkpoint writes that paused the steps, and when a beat first reported a step
    # past `resume_step` (or past 0).
    Column("resume_step", BigInteger),
    Column("restore_s", Float),
    Column("checkpoint_stall_s", Float),
    Column("new_step_at", UtcDateTime()),
    # Its workers' newest measure of their speed (training/heartbeat.py `Throughput`), what an elastic
    # sizing reads: the seconds of one optimizer step at its size, and the batch it ran at: each
    # worker's micro-batch, the micro-batches it accumulates per step, the global batch of a step.
    Column("step_s", Float),
    Column("local_batch", Integer),
    Column("accum_steps", Integer),
    Column("global_batch", Integer),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    # (job, number) is the idempotency key of a launch: a duplicate message cannot make a second one.
    UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),
    Index("ix_attempts_state", "state"),
)

leases = Table(
    "leases",
    metadata,
    Column("node", String(253), primary_key=True),
    Column("gpu_index", Integer, primary_key=True),
    Column("attempt_id", String(48), ForeignKey("attempts.id"), nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Index("ix_leases_attempt", "attempt_id"),
)

# The event log is also the transactional outbox: a row written in the same transaction as the
# change it records, published by the relay, which then sets `published_at`.
events = Table(
    "events",
    metadata,
    Column("seq", SeqId, primary_key=True, autoincrement=True),
    Column("type", String(64), nullable=False),
    Column("job_id", String(40), nullable=False),
    Column("attempt_id", String(48)),
    Column("data", JSON, nullable=False),
    Column("at", UtcDateTime(), nullable=False),
    Column("published_at", UtcDateTime()),
    Index("ix_events_job", "job_id", "seq"),
    Index(
        "ix_events_unpublished",
        "seq",
        postgresql_where=text("published_at IS NULL"),
        sqlite_where=text("published_at IS NULL"),
    ),
)

# A monotonically increasing source of fencing tokens, shared by every scheduler replica.
fencing = Table(
    "fencing",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("value", BigInteger, nullable=False),
)

# Leader election by lease: one scheduler (or reaper) replica holds each name until it expires.
# `epoch` grows each time the lead changes hands or lapses (store/leadership.py).
leaders = Table(
    "leaders",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(64), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Column("epoch", BigInteger, nullable=False, server_default="0"),
)

# Why each pending job waits, as the leading scheduler's last pass decided (scheduler/waiting.py): the
# API reads it for /v1/queue and never runs a cycle itself. `job_updated_at` is the job's row as that
# pass read it: a reason recorded before the job's row changed is not the job's any more.
waits = Table(
    "waits",
    metadata,
    Column("job_id", String(40), primary_key=True),
    Column("code", String(16), nullable=False),
    Column("text", Text, nullable=False),
    Column("since", UtcDateTime(), nullable=False),
    Column("job_updated_at", UtcDateTime(), nullable=False),
)

# How often each node interrupts the attempts on it (domain/interruptions.py): decayed attempt time
# and interruptions, updated in the transaction that ends each attempt; the heartbeat's automatic
# checkpoint interval reads the rows of the attempt's nodes.
node_interruptions = Table(
    "node_interruptions",
    metadata,
    Column("node", String(253), primary_key=True),
    Column("run_s", Float, nullable=False),
    Column("interruptions", Float, nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
)

# A job's checkpoint on its way to another site (scheduler/mover.py, store/transfers.py): one row per
# job, its newest transfer. Copied outside the scheduling passes by the leading replica, whose epoch
# owns the row: each write confirms the lead and that epoch, and a new leader adopts the row (its
# epoch) and resumes from the files already verified at the destination (`files`: path -> sha256).
checkpoint_transfers = Table(
    "checkpoint_transfers",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id"), primary_key=True),
    Column("state", String(16), nullable=False),  # COPYING | LANDED | ABANDONED
    Column("epoch", BigInteger, nullable=False),  # the leader's epoch that owns it
    Column("source", Text, nullable=False),  # the checkpoint's step folder where it lies
    Column("destination", Text, nullable=False),  # its step folder at the destination
    Column("from_site", String(63), nullable=False),
    Column("site", String(63), nullable=False),
    Column("step", BigInteger),
    Column("bytes_total", BigInteger, nullable=False),  # the estimate's until the copy lists the source
    Column("bytes_done", BigInteger, nullable=False),
    Column("files", JSON, nullable=False),  # path -> sha256 of each file verified at the destination
    Column("estimate_s", Float, nullable=False),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("deadline_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Column("reason", Text),  # why it was abandoned
)
