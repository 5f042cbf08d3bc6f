"""scheduling: attempt lifecycle columns, job retry and checkpoint columns, leader leases

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("not_before", _TS, nullable=True))
        batch.add_column(sa.Column("attained_gpu_s", sa.Float(), server_default=sa.text("0"), nullable=False))
        batch.add_column(
            sa.Column("progress_lost_gpu_s", sa.Float(), server_default=sa.text("0"), nullable=False)
        )
        batch.add_column(sa.Column("checkpoint_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("checkpoint_step", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("checkpoint_site", sa.String(63), nullable=True))
        batch.add_column(sa.Column("checkpoint_cost_s", sa.Float(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("checkpoint_at", _TS, nullable=True))
        batch.add_column(sa.Column("stop_requested", sa.String(32), nullable=True))
        batch.add_column(sa.Column("borrowed", sa.Boolean(), server_default=sa.text("false"), nullable=False))
        batch.add_column(sa.Column("started_at", _TS, nullable=True))
        batch.add_column(sa.Column("ended_at", _TS, nullable=True))
        batch.add_column(sa.Column("heartbeat_at", _TS, nullable=True))
        batch.add_column(sa.Column("progress_lost_s", sa.Float(), nullable=True))
    op.create_table(
        "leaders",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leaders")
    with op.batch_alter_table("attempts") as batch:
        for name in (
            "progress_lost_s",
            "heartbeat_at",
            "ended_at",
            "started_at",
            "borrowed",
            "stop_requested",
            "checkpoint_at",
        ):
            batch.drop_column(name)
    with op.batch_alter_table("jobs") as batch:
        for name in (
            "checkpoint_cost_s",
            "checkpoint_site",
            "checkpoint_step",
            "checkpoint_url",
            "progress_lost_gpu_s",
            "attained_gpu_s",
            "not_before",
        ):
            batch.drop_column(name)
