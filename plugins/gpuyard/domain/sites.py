"""Moving work between sites: the WAN between them, what a checkpoint copy costs, and when it pays.

Between data centres gpuyard moves jobs and checkpoints, never synchronous gradients
(docs/system-design.md, section 4): a run stays inside one site, and a job that waits at the site
holding its checkpoint may resume at another once the time it would save beats the copy. These are
pure rules; the scheduler's site rules (`scheduler/sites.py`) and the simulator (`sim/sites.py`)
read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# A copy opens its connections, lists the checkpoint, asks for its files and checks what landed: a
# few round trips beside the bytes, whatever the size (parallel streams keep a long link full).
COPY_ROUND_TRIPS = 4


@dataclass(frozen=True)
class Wan:
    """The link between every two sites, in each direction: bandwidth (shared by the copies under way
    in that direction), round-trip time, and the price of bytes leaving a site."""

    gbit_s: float  # usable bandwidth of one copy, Gbit/s
    rtt_s: float  # round-trip time
    egress_usd_per_gb: float  # per GB (10^9 bytes) sent out of a site
    round_trips: int = COPY_ROUND_TRIPS  # per copy, beside the bytes

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gbit_s) and self.gbit_s > 0):
            raise ValueError(f"WAN bandwidth must be a finite number of Gbit/s > 0, got {self.gbit_s!r}")
        if not (math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise ValueError(f"WAN round-trip time must be finite seconds >= 0, got {self.rtt_s!r}")
        if not (math.isfinite(self.egress_usd_per_gb) and self.egress_usd_per_gb >= 0):
            raise ValueError(f"egress price must be finite USD per GB >= 0, got {self.egress_usd_per_gb!r}")
        if self.round_trips < 0:
            raise ValueError(f"round trips per copy must be >= 0, got {self.round_trips!r}")

    @property
    def bytes_per_s(self) -> float:
        return self.gbit_s * 1e9 / 8

    @property
    def overhead_s(self) -> float:
        """What a copy waits on beside its bytes: its round trips."""
        return self.round_trips * self.rtt_s


def transfer_s(nbytes: float, wan: Wan, sharing: int = 1) -> float:
    """Seconds to copy `nbytes` between two sites: its round trips, and the bytes at the link's rate
    shared with `sharing - 1` other copies in the same direction. Nothing to copy costs nothing."""
    if nbytes < 0:
        raise ValueError(f"a copy of a negative size: {nbytes!r} bytes")
    if sharing < 1:
        raise ValueError(f"a copy shares the link with itself at least: sharing {sharing!r}")
    if nbytes == 0:
        return 0.0
    return wan.overhead_s + nbytes * sharing / wan.bytes_per_s


def egress_usd(nbytes: float, wan: Wan) -> float:
    """What sending `nbytes` out of a site costs."""
    return nbytes / 1e9 * wan.egress_usd_per_gb


def move_pays(waited_s: float, copy_s: float) -> bool:
    """Does a job waiting at its site gain by moving to another site that has room now?

    The time a move saves is the wait the job still has ahead of it at its site, which nobody knows:
    it hangs on when running jobs end, and no scheduler here reads a job's duration. The rule takes
    the wait so far as the estimate of the wait still to come (a full site frees room as its runs
    end, and run times are heavy-tailed: Philly's median is 1,144 s, its p99 254,884 s) and moves
    once that beats the copy: `waited_s >= copy_s`. It is the ski-rental rule: wait while the wait
    so far is under the copy, then copy; whatever the rest of the wait turns out to be, the job
    spends at most twice the better of the two choices (while the other site keeps its room). A job
    with nothing to copy moves as soon as its site has no room.
    """
    if waited_s < 0 or copy_s < 0:
        raise ValueError(f"waited and copy times must be >= 0, got {waited_s!r} and {copy_s!r}")
    return waited_s >= copy_s
