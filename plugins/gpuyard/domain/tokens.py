"""How long API tokens live: a default lifetime and a maximum, set by the platform (`settings.tokens`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TokenLifetimeError(ValueError):
    """The requested expiry is in the past or beyond the platform's maximum; the message says which."""


class TokenPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    default_days: int = Field(90, ge=1, le=3650, description="Lifetime of a token made without an expiry.")
    max_days: int = Field(365, ge=1, le=3650, description="No token lives longer than this.")

    @model_validator(mode="after")
    def _default_within_max(self) -> TokenPolicy:
        if self.default_days > self.max_days:
            raise ValueError(f"default_days ({self.default_days}) is over max_days ({self.max_days})")
        return self

    def expiry(self, now: datetime, requested: datetime | None = None) -> datetime:
        """When a token made `now` expires: `requested`, within the limits, or the default lifetime."""
        if requested is None:
            return now + timedelta(days=self.default_days)
        if requested.tzinfo is None:
            raise TokenLifetimeError(f"expected a time with a UTC offset, got {requested.isoformat()}")
        if requested <= now:
            raise TokenLifetimeError(f"must be in the future, got {requested.isoformat()}")
        latest = now + timedelta(days=self.max_days)
        if requested > latest:
            raise TokenLifetimeError(
                f"tokens live at most {self.max_days} days on this platform (until {latest:%Y-%m-%d}), "
                f"got {requested.isoformat()}"
            )
        return requested
