"""Teams with their quotas, and API tokens (stored as SHA-256 hashes, compared in constant time)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.store.tables import teams, tokens


class Role(StrEnum):
    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    PLATFORM_ADMIN = "platform-admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: resolved from a bearer token."""

    token_id: str
    team: str
    role: Role

    @property
    def is_platform_admin(self) -> bool:
        return self.role == Role.PLATFORM_ADMIN

    def can_see(self, team: str) -> bool:
        return self.is_platform_admin or team == self.team


TOKEN_PREFIX = "gy"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def ensure_team(conn: Connection, name: str, quota: TeamQuota, at: datetime) -> bool:
    """Create the team with `quota` unless it exists. Returns whether it was created."""
    if conn.execute(select(teams.c.name).where(teams.c.name == name)).first():
        return False
    try:
        with conn.begin_nested():
            conn.execute(insert(teams).values(name=name, **_quota_row(quota), created_at=at, updated_at=at))
    except IntegrityError:  # created concurrently
        return False
    return True


def get_quota(conn: Connection, team: str) -> TeamQuota | None:
    row = conn.execute(select(teams).where(teams.c.name == team)).first()
    return _quota(row) if row else None


def list_teams(conn: Connection) -> dict[str, TeamQuota]:
    return {row.name: _quota(row) for row in conn.execute(select(teams).order_by(teams.c.name))}


def set_quota(conn: Connection, team: str, quota: TeamQuota, at: datetime) -> bool:
    """Replace the team's quota; creates the team if needed. Returns whether it was created."""
    created = ensure_team(conn, team, quota, at)
    if not created:
        conn.execute(update(teams).where(teams.c.name == team).values(**_quota_row(quota), updated_at=at))
    return created


def create_token(conn: Connection, team: str, role: Role, at: datetime, description: str = "") -> str:
    """Store a new token's hash; return the token itself, which is shown once and never stored."""
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    conn.execute(
        insert(tokens).values(
            id=token_id,
            secret_hash=_hash(secret),
            team=team,
            role=role.value,
            description=description,
            created_at=at,
        )
    )
    return f"{TOKEN_PREFIX}_{token_id}_{secret}"


def revoke_token(conn: Connection, token_id: str, at: datetime) -> bool:
    result = conn.execute(
        update(tokens).where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None)).values(revoked_at=at)
    )
    return result.rowcount == 1


def token_team(conn: Connection, token_id: str) -> str | None:
    return conn.execute(select(tokens.c.team).where(tokens.c.id == token_id)).scalar()


def authenticate(conn: Connection, token: str) -> Principal | None:
    """Resolve a bearer token, or None. The secret is compared in constant time."""
    prefix, _, rest = token.partition("_")
    token_id, _, secret = rest.partition("_")
    if prefix != TOKEN_PREFIX or not token_id or not secret:
        return None
    row = conn.execute(select(tokens).where(tokens.c.id == token_id)).first()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.secret_hash, _hash(secret)):
        return None
    return Principal(token_id=row.id, team=row.team, role=Role(row.role))


def _quota_row(quota: TeamQuota) -> dict[str, Any]:
    return {
        "max_gpus_per_job": quota.max_gpus_per_job,
        "allowed_gpu_types": list(quota.allowed_gpu_types),
        "gpu_quota": quota.gpu_quota,
        "cohort": quota.cohort,
        "weight": quota.weight,
    }


def _quota(row: Any) -> TeamQuota:
    return TeamQuota(
        max_gpus_per_job=row.max_gpus_per_job,
        allowed_gpu_types=tuple(row.allowed_gpu_types),
        gpu_quota=row.gpu_quota,
        cohort=row.cohort,
        weight=row.weight,
    )
