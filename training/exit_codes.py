"""Exit codes of a training worker: the contract between the runtime and the launcher."""

from __future__ import annotations

from typing import Final

SUCCESS: Final = 0
"""Training reached its last step; the final checkpoint and model are saved."""

FAILURE: Final = 1
"""The run failed on its own (bad config, bad data, a bug): counts against the retry budget."""

PREEMPTED: Final = 75
"""EX_TEMPFAIL: stopped on SIGTERM or a `checkpoint_and_stop` heartbeat answer, checkpoint saved."""

STALE_FENCING_TOKEN: Final = 76
"""Stopped because the control plane refused the attempt: its fencing token is stale (HTTP 409 or
`stop`), or its secret proves no live attempt (HTTP 401: the attempt has ended); nothing written."""

DESCRIPTIONS: Final = {
    SUCCESS: "success",
    FAILURE: "failure",
    PREEMPTED: "preempted, checkpoint saved",
    STALE_FENCING_TOKEN: "stopped on a stale fencing token, no checkpoint written",
}
