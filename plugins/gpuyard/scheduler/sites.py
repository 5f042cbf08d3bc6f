"""Site rules, by name (`SITE_RULES`): at which site a job may start or resume. A policy names its
rule (`policy.Policy.sites`); a new rule is one entry.

A rule reads the job and the snapshot and answers with a `Where`: the site the cycle searches first
(the job's own site, `PendingJob.own_site`: of the sites holding its checkpoint or data and its home,
where a start copies least), and the other sites it may then look at. The cycle applies it only on
a fleet of more than one site (`cycle.run_cycle`); preemption and head reservations stay at the
job's own site, as a move pays its copy on top of a victim's.

- `any`: no site of its own; one scored search over every domain of the fleet, the checkpoint's and
  the data's sites preferred by the `checkpoint_locality` and `data_locality` scores (the
  platform's behaviour before sites were modelled).
- `home`: only its own site; a job waits for it (`stay`).
- `move`: its own site first; each other site with room now once the move there pays
  (`domain.sites.move_pays`: its wait so far reaches what a start there copies beyond a start at
  its own site, its checkpoint and the data no copy of which lies there (`PendingJob.needs`), over
  the snapshot's WAN, shared with the copies already under way on that link, `ClusterState.copies`).
  Without a WAN in the snapshot (`ClusterState.wan`: the service's is the `moves` setting's, where
  it gives a rate) it is `any`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from gpuyard.domain.sites import Wan, copy_source, move_pays, staged_bytes, staging_s, transfer_s
from gpuyard.scheduler.snapshot import ClusterState, PendingJob


@dataclass(frozen=True)
class Where:
    """Where a job may be placed this cycle."""

    site: str | None  # the site searched first; None: every site alike (one scored search)
    moves: tuple[str, ...] = ()  # after its site, these others (where a move pays now), fleet order


ANYWHERE = Where(None)


def any_site(job: PendingJob, state: ClusterState, now: datetime) -> Where:
    return ANYWHERE


def _own(job: PendingJob, state: ClusterState) -> str | None:
    """Its own site, where the fleet has it (a site gone from the fleet is no one's)."""
    return job.own_site if job.own_site in state.index.sites else None


def home_site(job: PendingJob, state: ClusterState, now: datetime) -> Where:
    """Its own site only: where a start copies least (its checkpoint's, else its data's or home)."""
    site = _own(job, state)
    return ANYWHERE if site is None else Where(site)


def start_copy_s(job: PendingJob, site: str, state: ClusterState) -> float:
    """How long a start at `site` would wait on its copies now: what it lacks there over the WAN,
    sharing the link it mostly comes over with the copies already under way on it."""
    nbytes = staged_bytes(site, job.needs)
    if state.wan is None or not nbytes:
        return 0.0
    source = copy_source(site, job.needs)
    return transfer_s(nbytes, state.wan, sharing=state.copies.get((source, site), 0) + 1)


def move_when_it_pays(job: PendingJob, state: ClusterState, now: datetime) -> Where:
    """Its own site first, then each other site once the time waited beats what the move copies."""
    site = _own(job, state)
    if site is None or state.wan is None:
        return ANYWHERE
    waited = job.waited_s(now)
    stay = start_copy_s(job, site, state)
    return Where(
        site,
        tuple(
            other
            for other in state.index.sites
            if other != site
            and (not job.sites or other in job.sites)
            and move_pays(waited, start_copy_s(job, other, state), stay)
        ),
    )


def pays_after_s(job: PendingJob, sites: Iterable[str], wan: Wan) -> set[float]:
    """The waits at which a move of the queued `job` to one of `sites` starts to pay, each copy
    alone on its link (copies under way delay it: a cycle then comes later); 0s left out. Whoever
    runs cycles runs one at each (the simulator)."""
    site = job.own_site
    if site is None:
        return set()
    stay = staging_s(site, job.needs, wan)
    return {
        wait
        for other in sites
        if other != site
        and (not job.sites or other in job.sites)
        and (wait := staging_s(other, job.needs, wan) - stay) > 0
    }


@dataclass(frozen=True)
class SiteRule:
    name: str
    where: Callable[[PendingJob, ClusterState, datetime], Where]
    # Its answer changes as a job waits: whoever runs cycles runs one when a queued job's wait
    # reaches a move's copy (`pays_after_s`; the simulator does; the service passes every second).
    waits: bool = False


SITE_RULES: dict[str, SiteRule] = {
    rule.name: rule
    for rule in (
        SiteRule("any", any_site),
        SiteRule("home", home_site),
        SiteRule("move", move_when_it_pays, waits=True),
    )
}
