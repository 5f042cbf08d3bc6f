"""Teams with their quotas and admission policies, and API tokens.

Tokens are stored as SHA-256 hashes and compared in constant time; each expires (`expires_at`) and
records when it was last used, at most once a minute so that reads stay reads.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from gpuyard.clock import utcnow
from gpuyard.domain.admission import AdmissionPolicy
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.tokens import TokenPolicy
from gpuyard.store.tables import teams, tokens

LAST_USED_RESOLUTION = timedelta(minutes=1)


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
    expires_at: datetime

    @property
    def is_platform_admin(self) -> bool:
        return self.role == Role.PLATFORM_ADMIN

    def can_see(self, team: str) -> bool:
        return self.is_platform_admin or team == self.team


@dataclass(frozen=True)
class Team:
    name: str
    quota: TeamQuota
    policy: AdmissionPolicy


@dataclass(frozen=True)
class TokenInfo:
    """A token as listed: everything but the secret, which is never stored."""

    id: str
    team: str
    role: Role
    description: str
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


TOKEN_PREFIX = "gy"
_ID_HEX, _SECRET_CHARS = 16, 43  # secrets.token_hex(8), secrets.token_urlsafe(32)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def ensure_team(conn: Connection, name: str, quota: TeamQuota, at: datetime) -> bool:
    """Create the team with `quota` and an empty admission policy unless it exists; True if created."""
    if conn.execute(select(teams.c.name).where(teams.c.name == name)).first():
        return False
    try:
        with conn.begin_nested():
            conn.execute(
                insert(teams).values(
                    name=name,
                    **_quota_row(quota),
                    **_policy_row(AdmissionPolicy()),
                    created_at=at,
                    updated_at=at,
                )
            )
    except IntegrityError:  # created concurrently
        return False
    return True


def get_quota(conn: Connection, team: str) -> TeamQuota | None:
    found = get_team(conn, team)
    return found.quota if found else None


def get_team(conn: Connection, team: str) -> Team | None:
    row = conn.execute(select(teams).where(teams.c.name == team)).first()
    return Team(row.name, _quota(row), _policy(row)) if row else None


def configured_checkpoint_roots(conn: Connection, team: str) -> dict[str, tuple[str, ...]]:
    """Site -> the checkpoint roots the team's policy names there (none for a team not found)."""
    found = get_team(conn, team)
    return dict(found.policy.checkpoint_roots) if found else {}


def list_teams(conn: Connection) -> dict[str, TeamQuota]:
    return {row.name: _quota(row) for row in conn.execute(select(teams).order_by(teams.c.name))}


def set_quota(conn: Connection, team: str, quota: TeamQuota, at: datetime) -> bool:
    """Replace the team's quota; creates the team if needed. Returns whether it was created."""
    created = ensure_team(conn, team, quota, at)
    if not created:
        conn.execute(update(teams).where(teams.c.name == team).values(**_quota_row(quota), updated_at=at))
    return created


def set_policy(conn: Connection, team: str, policy: AdmissionPolicy, at: datetime) -> bool:
    """Replace the team's admission policy. Returns False when there is no such team."""
    result = conn.execute(
        update(teams).where(teams.c.name == team).values(**_policy_row(policy), updated_at=at)
    )
    return result.rowcount == 1


def create_token(
    conn: Connection,
    team: str,
    role: Role,
    at: datetime,
    description: str = "",
    *,
    expires_at: datetime | None = None,
) -> str:
    """Store a new token's hash; return the token itself, which is shown once and never stored.
    Without `expires_at` it lives the default lifetime of the platform's token policy."""
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
            expires_at=expires_at or TokenPolicy().expiry(at),
        )
    )
    return f"{TOKEN_PREFIX}_{token_id}_{secret}"


def token_id_of(token: str) -> str:
    return token.split("_")[1]


def revoke_token(conn: Connection, token_id: str, at: datetime) -> bool:
    result = conn.execute(
        update(tokens).where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None)).values(revoked_at=at)
    )
    return result.rowcount == 1


def token_team(conn: Connection, token_id: str) -> str | None:
    return conn.execute(select(tokens.c.team).where(tokens.c.id == token_id)).scalar()


def list_tokens(conn: Connection, team: str | None) -> list[TokenInfo]:
    """The tokens of `team` (every team's when None), newest first."""
    listed = [tokens.c[f.name] for f in fields(TokenInfo)]  # never the secret's hash
    query = select(*listed).order_by(tokens.c.created_at.desc(), tokens.c.id)
    if team is not None:
        query = query.where(tokens.c.team == team)
    return [TokenInfo(**{**r._mapping, "role": Role(r.role)}) for r in conn.execute(query)]


def authenticate(conn: Connection, token: str, now: datetime | None = None) -> Principal | None:
    """Resolve a bearer token, or None when it is malformed, unknown, revoked or expired.

    The secret is compared in constant time. The token's last use is recorded when the stored one is
    over a minute old: a write at most once a minute per token, and only on a cache miss.
    """
    now = now or utcnow()
    prefix, _, rest = token.partition("_")
    token_id, _, secret = rest.partition("_")
    if prefix != TOKEN_PREFIX or len(token_id) != _ID_HEX or len(secret) != _SECRET_CHARS:
        return None  # not the shape of a token this store makes: no read
    row = conn.execute(select(tokens).where(tokens.c.id == token_id)).first()
    if row is None or row.revoked_at is not None or row.expires_at <= now:
        return None
    if not hmac.compare_digest(row.secret_hash, _hash(secret)):
        return None
    if row.last_used_at is None or row.last_used_at < now - LAST_USED_RESOLUTION:
        conn.execute(
            update(tokens)
            .where(
                tokens.c.id == token_id,
                or_(tokens.c.last_used_at.is_(None), tokens.c.last_used_at < now - LAST_USED_RESOLUTION),
            )
            .values(last_used_at=now)
        )
    return Principal(token_id=row.id, team=row.team, role=Role(row.role), expires_at=row.expires_at)


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


def _policy_row(policy: AdmissionPolicy) -> dict[str, Any]:
    return {
        "allowed_registries": list(policy.allowed_registries),
        "require_digest": policy.require_digest,
        "allowed_priorities": list(policy.allowed_priorities),
        "checkpoint_roots": {site: list(roots) for site, roots in policy.checkpoint_roots.items()},
    }


def _policy(row: Any) -> AdmissionPolicy:
    return AdmissionPolicy(
        allowed_registries=tuple(row.allowed_registries),
        require_digest=row.require_digest,
        allowed_priorities=tuple(row.allowed_priorities),
        checkpoint_roots={site: tuple(roots) for site, roots in row.checkpoint_roots.items()},
    )
