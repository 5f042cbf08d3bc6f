"""checkpoint roots: each team's checkpoint folders per site, set by a platform admin

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # In place (ALTER TABLE ADD COLUMN): on SQLite a batch copy would drop `teams`, which jobs and
    # tokens reference.
    with op.batch_alter_table("teams", recreate="never") as batch:
        batch.add_column(
            sa.Column("checkpoint_roots", sa.JSON(), server_default=sa.text("'{}'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("teams", recreate="never") as batch:  # SQLite >= 3.35 drops in place
        batch.drop_column("checkpoint_roots")
