"""liveness: each attempt's lease expiry (renewed by its workers and by its launcher), when its step
last advanced (hang detection), and when its job first ran (max_runtime)

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("lease_expires_at", _TS, nullable=True))
        batch.add_column(sa.Column("progress_at", _TS, nullable=True))
    # Live attempts keep the expiry their GPU leases had (GPU-less ones: their last update).
    op.execute(
        "UPDATE attempts SET lease_expires_at = COALESCE("
        "(SELECT MAX(leases.expires_at) FROM leases WHERE leases.attempt_id = attempts.id), updated_at) "
        "WHERE state IN ('CREATED', 'LAUNCHING', 'RUNNING')"
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("first_started_at", _TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("first_started_at")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("progress_at")
        batch.drop_column("lease_expires_at")
