"""The per-attempt secret: what a worker proves its attempt with on every heartbeat.

Made at random when the attempt is reserved, handed to its workers at launch (their environment on
the local launcher, the attempt's Secret on Kubernetes), shown by no API response or event, and
cleared when the attempt ends: a worker that outlives its attempt proves nothing any more. The
fencing token is not a credential (it is a counter, guessable); it orders writes.
"""

from __future__ import annotations

import hmac
import secrets

SECRET_BYTES = 32  # 43 URL-safe characters (the store's column holds 64)


def new_attempt_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def proves(expected: str | None, offered: str) -> bool:
    """`offered` is the attempt's secret, compared in constant time. An ended attempt (`expected`
    None) and an empty offer prove nothing."""
    if expected is None or not offered:
        return False
    return hmac.compare_digest(expected.encode(), offered.encode())
