"""attempt accounting: the checkpoint step each attempt resumes from, and what its workers report of
its restore, its checkpoint stalls and its first new step (docs/metrics.md)

Attempts from before the upgrade have none of it: they count as no resume, with no restore and no
stall, so the window's figures are exact once it holds only attempts reserved after the upgrade.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("resume_step", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("restore_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("checkpoint_stall_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("new_step_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("new_step_at")
        batch.drop_column("checkpoint_stall_s")
        batch.drop_column("restore_s")
        batch.drop_column("resume_step")
