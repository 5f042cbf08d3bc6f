"""waits: why each pending job waits, recorded by the scheduler's pass and read by the API

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "waits",
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column("code", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("since", _TS, nullable=False),
        sa.Column("job_updated_at", _TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("waits")
