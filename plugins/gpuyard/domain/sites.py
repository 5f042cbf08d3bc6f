"""Moving work between sites: the WAN between them, what a start copies first, and when a move pays.

Between data centres gpuyard moves jobs and checkpoints, never synchronous gradients
(docs/system-design.md, section 4): a run stays inside one site. A start copies to its site first
whatever it needs that no copy of lies there: its newest checkpoint, and the data it reads
(`Held`). A job that waits at its own site (where a start copies least) may start at another once
the time it would save beats what the move copies. These are pure rules; the scheduler's site rules
and scores (`scheduler/sites.py`, `scheduler/plugins.py`) and the simulator (`sim/engine.py`) read
them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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


@dataclass(frozen=True)
class Held:
    """Bytes a start needs at its site, and the sites holding a copy: a job's newest checkpoint, or
    data it reads. Held nowhere in particular (no site): every site reaches it alike, and no start
    copies it."""

    nbytes: float  # 0: its size is not known
    sites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.nbytes) and self.nbytes >= 0):
            raise ValueError(f"held bytes must be a finite number >= 0, got {self.nbytes!r}")


def staged_bytes(site: str, needs: Iterable[Held]) -> float:
    """What a start at `site` copies there first: the bytes of all it needs that no copy of lies
    there."""
    return sum(held.nbytes for held in needs if held.sites and site not in held.sites)


def staging_s(site: str, needs: Iterable[Held], wan: Wan, sharing: int = 1) -> float:
    """How long a start at `site` waits on its copies: the bytes it lacks there over the link, as
    one copy (`transfer_s`)."""
    return transfer_s(staged_bytes(site, needs), wan, sharing)


def copy_source(site: str, needs: Iterable[Held]) -> str | None:
    """The site a start at `site` copies most of its bytes from, each thing it lacks coming from the
    first site named holding it (ties: the first such site met); None: it lacks nothing there. The
    copy is charged to that one link: with two sites, the only other."""
    sent: dict[str, float] = {}
    for held in needs:
        if held.sites and site not in held.sites:
            sent[held.sites[0]] = sent.get(held.sites[0], 0.0) + held.nbytes
    return max(sent, key=lambda s: sent[s]) if sent else None


def least_copied(sites: Sequence[str], needs: Sequence[Held]) -> str | None:
    """Of `sites`, the one where a start copies the fewest bytes (ties: the first); None if none."""
    return min(sites, key=lambda s: staged_bytes(s, needs)) if sites else None


def held_share(site: str, data: Sequence[Held]) -> float:
    """The share of `data` a start at `site` finds there, by bytes (by count where no size is
    given): 1 with no data."""
    total = sum(held.nbytes for held in data)
    if total > 0:
        return 1.0 - staged_bytes(site, data) / total
    if not data:
        return 1.0
    return sum(1 for held in data if not held.sites or site in held.sites) / len(data)


def move_pays(waited_s: float, copy_s: float, stay_s: float = 0.0) -> bool:
    """Does a job waiting at its own site gain by starting at another site that has room now?

    The time a move saves is the wait the job still has ahead of it at its site, which nobody knows:
    it hangs on when running jobs end, and no scheduler here reads a job's duration. The rule takes
    the wait so far as the estimate of the wait still to come (a full site frees room as its runs
    end, and run times are heavy-tailed: Philly's median is 1,144 s, its p99 254,884 s) and moves
    once that beats the copy: `waited_s >= copy_s`. It is the ski-rental rule: wait while the wait
    so far is under the copy, then copy; whatever the rest of the wait turns out to be, the job
    spends at most twice the better of the two choices (while the other site keeps its room). A job
    with nothing to copy moves as soon as its site has no room.

    A start at its own site may copy too (`stay_s`: its data, when its checkpoint lies at another
    site; its own site is where a start copies least): the move then costs only what it copies
    beyond that, `waited_s >= copy_s - stay_s`. Checkpoint and data are one copy, charged alike.
    """
    if waited_s < 0 or copy_s < 0 or stay_s < 0:
        raise ValueError(f"waited and copy times must be >= 0, got {waited_s!r}, {copy_s!r} and {stay_s!r}")
    return waited_s >= copy_s - stay_s


def copy_deadline_s(estimate_s: float, factor: float, floor_s: float) -> float:
    """How long a move's copy may run before it is abandoned (the job then stays at its own site):
    `factor` times the scheduler's estimate of it, and at least `floor_s` (a copy estimated at
    nothing, whose size or link is not known, still gets that long)."""
    if estimate_s < 0 or factor < 1 or floor_s <= 0:
        raise ValueError(
            f"a copy deadline needs an estimate >= 0 s, a factor >= 1 and a floor > 0 s, "
            f"got {estimate_s!r}, {factor!r} and {floor_s!r}"
        )
    return max(floor_s, factor * estimate_s)
