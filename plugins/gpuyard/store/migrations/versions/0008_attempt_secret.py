"""attempt secret: each attempt's random secret, the worker's proof of its attempt on heartbeats

Live attempts get one too, so every live attempt has a secret and any replica can launch a reserved
one. The workers of attempts launched before the upgrade never received theirs: their heartbeats are
refused (401), and they run on while their launcher sees them alive, their progress and checkpoints
unrecorded. Upgrade with no attempt running, or let those finish.

Revision ID: 0008
Revises: 0007
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

LIVE = ("CREATED", "LAUNCHING", "RUNNING")


def upgrade() -> None:
    # In place (ALTER TABLE ADD COLUMN): on SQLite a batch copy would drop `attempts`, which leases
    # reference.
    with op.batch_alter_table("attempts", recreate="never") as batch:
        batch.add_column(sa.Column("attempt_secret", sa.String(64), nullable=True))
    attempts = sa.table(
        "attempts", sa.column("id", sa.String), sa.column("state", sa.String), sa.column("attempt_secret")
    )
    bind = op.get_bind()
    live = bind.execute(sa.select(attempts.c.id).where(attempts.c.state.in_(LIVE))).scalars().all()
    for attempt_id in live:
        bind.execute(
            attempts.update()
            .where(attempts.c.id == attempt_id)
            .values(attempt_secret=secrets.token_urlsafe(32))
        )


def downgrade() -> None:
    with op.batch_alter_table("attempts", recreate="never") as batch:  # SQLite >= 3.35 drops in place
        batch.drop_column("attempt_secret")
