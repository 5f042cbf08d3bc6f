"""leader epoch: each leader lease counts how many times its lead changed hands (or lapsed), so a
replica can tell that it lost the lead between two looks, and a reservation can prove, inside its own
transaction, that its writer still leads

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leaders") as batch:
        batch.add_column(sa.Column("epoch", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("leaders") as batch:
        batch.drop_column("epoch")
