"""node interruptions: each node's decayed attempt time and interruptions, kept as attempts end

The table starts empty: every node is taken at its fleet prior (`Node.expected_mtbi_s`) until
attempts end on it after the upgrade.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_interruptions",
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("run_s", sa.Float(), nullable=False),
        sa.Column("interruptions", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_interruptions")
