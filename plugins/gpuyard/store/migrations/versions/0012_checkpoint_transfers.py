"""checkpoint transfers: a job's checkpoint copied to another site outside the scheduling passes,
owned by the leader's epoch (scheduler/mover.py); and the size of a job's newest checkpoint, as its
worker reported it, which a move's estimate reads

Jobs from before the upgrade have no checkpoint size (a move then estimates its copy at nothing).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("checkpoint_bytes", sa.BigInteger(), nullable=True))
    op.create_table(
        "checkpoint_transfers",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("destination", sa.Text(), nullable=False),
        sa.Column("from_site", sa.String(63), nullable=False),
        sa.Column("site", sa.String(63), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("bytes_total", sa.BigInteger(), nullable=False),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("estimate_s", sa.Float(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("deadline_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_transfers")
    # Not in batch mode: on SQLite that copies `jobs` and drops the original, which the attempts
    # referencing it refuse (foreign keys on); SQLite >= 3.35 drops a plain column in place.
    op.drop_column("jobs", "checkpoint_bytes")
