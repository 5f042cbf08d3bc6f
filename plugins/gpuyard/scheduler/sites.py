"""Site rules, by name (`SITE_RULES`): at which site a job may start or resume. A policy names its
rule (`policy.Policy.sites`); a new rule is one entry.

A rule reads the job and the snapshot and answers with a `Where`: the site the cycle searches first
(where the job's checkpoint lies, else its home site), and whether it may then look at the other
sites. The cycle applies it only on a fleet of more than one site (`cycle.run_cycle`); preemption
and head reservations stay at the job's own site, as a move pays its copy on top of a victim's.

- `any`: no site of its own; one scored search over every domain of the fleet, the checkpoint's
  site preferred by the `checkpoint_locality` score (the platform's behaviour before sites were
  modelled).
- `home`: only its own site; a job waits for it (`stay`).
- `move`: its own site first; another site with room now once the move pays
  (`domain.sites.move_pays`: its wait so far at its site reaches the copy time of what a move
  copies, `PendingJob.move_bytes`, over the snapshot's WAN, shared with the copies already under
  way from its site, `ClusterState.copies`). Without a WAN in the snapshot (`ClusterState.wan`: the
  service sets none yet) it is `any`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gpuyard.domain.sites import move_pays, transfer_s
from gpuyard.scheduler.snapshot import ClusterState, PendingJob


@dataclass(frozen=True)
class Where:
    """Where a job may be placed this cycle."""

    site: str | None  # the site searched first; None: every site alike (one scored search)
    may_move: bool  # after its site, the other sites (that have room now)


ANYWHERE = Where(None, True)


def any_site(job: PendingJob, state: ClusterState, now: datetime) -> Where:
    return ANYWHERE


def home_site(job: PendingJob, state: ClusterState, now: datetime) -> Where:
    """Its own site only: the one holding its checkpoint, else its home."""
    site = job.state_site
    return ANYWHERE if site is None else Where(site, False)


def copy_estimate_s(job: PendingJob, site: str, state: ClusterState) -> float:
    """How long moving the job's state out of `site` would take now: its bytes over the WAN, shared
    with the copies already under way from there (the least busy direction)."""
    if state.wan is None:
        return 0.0
    busy = min(
        (state.copies.get((site, other), 0) for other in state.index.sites if other != site), default=0
    )
    return transfer_s(job.move_bytes, state.wan, sharing=busy + 1)


def move_when_it_pays(job: PendingJob, state: ClusterState, now: datetime) -> Where:
    """Its own site first, then another once the time waited beats the copy."""
    site = job.state_site
    if site is None or state.wan is None:
        return ANYWHERE
    return Where(site, move_pays(job.waited_s(now), copy_estimate_s(job, site, state)))


@dataclass(frozen=True)
class SiteRule:
    name: str
    where: Callable[[PendingJob, ClusterState, datetime], Where]
    # Its answer changes as a job waits: whoever runs cycles runs one when a queued job's wait
    # reaches its copy estimate (the simulator does; the service passes every second anyway).
    waits: bool = False


SITE_RULES: dict[str, SiteRule] = {
    rule.name: rule
    for rule in (
        SiteRule("any", any_site),
        SiteRule("home", home_site),
        SiteRule("move", move_when_it_pays, waits=True),
    )
}
