"""security: token expiry and last use, each team's admission policy

Team weights past the new bound (1000, or infinite) are set to it. Tokens made before this revision
never expired; they now expire 90 days after the upgrade (the
default lifetime), so nothing stops working at once and nothing lives forever.

Revision ID: 0004
Revises: 0003
"""

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
LEGACY_TOKEN_LIFETIME = timedelta(days=90)


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("expires_at", _TS, nullable=True))
        batch.add_column(sa.Column("last_used_at", _TS, nullable=True))
    tokens = sa.table("tokens", sa.column("expires_at", _TS))
    op.execute(
        tokens.update()
        .where(tokens.c.expires_at.is_(None))
        .values(expires_at=datetime.now(UTC) + LEGACY_TOKEN_LIFETIME)
    )
    with op.batch_alter_table("tokens") as batch:
        batch.alter_column("expires_at", existing_type=_TS, nullable=False)
    # Weights are now finite and at most 1000; an infinite (or, on PostgreSQL, NaN) one made every
    # fair-share figure NaN.
    op.execute("UPDATE teams SET weight = 1000 WHERE weight > 1000")
    # In place (ALTER TABLE ADD COLUMN): on SQLite a batch copy would drop `teams`, which jobs and
    # tokens reference.
    with op.batch_alter_table("teams", recreate="never") as batch:
        batch.add_column(
            sa.Column("allowed_registries", sa.JSON(), server_default=sa.text("'[]'"), nullable=False)
        )
        batch.add_column(
            sa.Column("require_digest", sa.Boolean(), server_default=sa.text("false"), nullable=False)
        )
        batch.add_column(
            sa.Column("allowed_priorities", sa.JSON(), server_default=sa.text("'[]'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("teams", recreate="never") as batch:  # SQLite >= 3.35 drops in place
        for name in ("allowed_priorities", "require_digest", "allowed_registries"):
            batch.drop_column(name)
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("last_used_at")
        batch.drop_column("expires_at")
