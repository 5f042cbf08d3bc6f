"""attempt throughput: what its workers measure of their steps, for elastic sizing (docs/jobspec.md,
"Elastic jobs"): the seconds of one optimizer step, each worker's micro-batch, the micro-batches
accumulated per step and the global batch

Attempts from before the upgrade, and workers that do not report them, have none of it.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("step_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("local_batch", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("accum_steps", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("global_batch", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("global_batch")
        batch.drop_column("accum_steps")
        batch.drop_column("local_batch")
        batch.drop_column("step_s")
