"""Several sites, each behind a Nodes API and a launcher of its own: one fleet and one launcher over them.

`SiteFleet` reads every site's nodes side by side, each read bounded by its site's timeout. A site
whose read errs or does not answer within it is **down**: its nodes are drained from the fleet
(nothing is placed there) until a read answers again. A site already down is not waited for: its
read goes on in the background, and the first fleet read that finds it answered brings its nodes
back. The fleet keeps every site's entry (its checkpoint store) whether its nodes are drained or not.
The fleet's reads alone decide which sites are down.

`SiteLauncher` routes each attempt to the launcher of its placement's site and merges what they
report. A site down is never called, so no pass waits on it: a launch there is refused as busy (the
attempt stays reserved, left to its lease), a stop signal waits until the site answers, a release
says that its workers may still run, and its attempts are neither alive nor starting, so their
leases lapse: the reaper fences those whose workers heartbeat and holds the others until the site
answers. A site that answers again is reconciled, as after a restart, with the attempts there that
are still wanted: it adopts their pods, reports LOST those whose pods went, and deletes the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from gpuyard.clock import Clock, utcnow
from gpuyard.domain.fleet import Fleet, Node, Site
from gpuyard.launchers.base import LaunchBusy, Launcher, LaunchRequest, Outcome, WorkerReport

log = logging.getLogger(__name__)


class SiteDown(LaunchBusy):
    """The attempt's site does not answer: nothing was asked of it (the call waits for the site)."""


@dataclass(frozen=True)
class SiteLink:
    """How one site's nodes are read: `read` lists them (bounded by the site's own request timeout),
    `timeout_s` is how long a fleet read waits for it."""

    site: str
    read: Callable[[], Sequence[Node]]
    timeout_s: float


class SiteFleet:
    """The fleet source of several sites (see the module's docstring); `down()` says which are down."""

    def __init__(self, links: Sequence[SiteLink], sites: tuple[Site, ...] = ()):
        self._links = {link.site: link for link in links}
        self._sites = sites
        self._pool = ThreadPoolExecutor(max_workers=len(links), thread_name_prefix="gpuyard-site-nodes")
        self._reads: dict[str, Future[Sequence[Node]]] = {}  # at most one read in flight per site
        self._down: dict[str, str] = {}  # site -> why it is down
        self._lock = threading.Lock()

    def down(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._down)

    def __call__(self) -> Fleet:
        with self._lock:
            started = time.monotonic()
            for name, link in self._links.items():
                if name not in self._reads:
                    self._reads[name] = self._pool.submit(link.read)
            nodes: list[Node] = []
            for name, link in self._links.items():
                waited = 0.0 if name in self._down else link.timeout_s - (time.monotonic() - started)
                nodes += self._settle(name, link, max(waited, 0.0))
        return Fleet(nodes=tuple(sorted(nodes, key=lambda node: (node.site, node.name))), sites=self._sites)

    def _settle(self, name: str, link: SiteLink, wait_s: float) -> Sequence[Node]:
        """The site's nodes when its read answered within `wait_s`; none (it is down) otherwise."""
        read = self._reads[name]
        try:
            found = read.result(timeout=wait_s)
        except TimeoutError:
            self._mark_down(name, f"its Nodes API did not answer within {link.timeout_s:g} s")
            return ()  # the read goes on; a later fleet read takes its answer
        except Exception as error:  # refused, reset, timed out by the client, or an API error
            del self._reads[name]
            self._mark_down(name, f"reading its nodes failed: {error}")
            return ()
        del self._reads[name]
        if self._down.pop(name, None) is not None:
            log.info("site %s answers again: its %d node(s) are back in the fleet", name, len(found))
        return found

    def _mark_down(self, name: str, why: str) -> None:
        if name not in self._down:
            log.warning("site %s is down: %s; its nodes are drained until it answers", name, why)
        self._down[name] = why

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class SiteLauncher:
    """The launcher of several sites (see the module's docstring). `down` names the sites not to call:
    the fleet's (`SiteFleet.down`)."""

    def __init__(
        self,
        launchers: Mapping[str, Launcher],
        down: Callable[[], Set[str]] = frozenset,
        *,
        clock: Clock = utcnow,
    ):
        self._launchers = dict(launchers)
        self._down = down
        self._clock = clock
        self._lock = threading.Lock()
        self._site: dict[str, str] = {}  # attempt id -> its site
        self._wanted: dict[str, LaunchRequest] = {}  # attempts launched or adopted, not yet ended or released
        self._behind: set[str] = set()  # sites seen down: reconciled again once they answer

    # -- where -------------------------------------------------------------------------------------

    def _reachable(self) -> dict[str, Launcher]:
        down = self._down()
        with self._lock:
            self._behind |= down & self._launchers.keys()
        return {site: launcher for site, launcher in self._launchers.items() if site not in down}

    def _launcher_of(self, attempt_id: str) -> tuple[str, Launcher] | None:
        """The attempt's site and its launcher, when it is known and answers; SiteDown when it does
        not answer; None when the attempt's site is not known."""
        with self._lock:
            site = self._site.get(attempt_id)
        if site is None:
            return None
        if site in self._down():
            raise SiteDown(f"site {site} does not answer")
        return site, self._launchers[site]

    def _forget(self, attempt_id: str) -> None:
        with self._lock:
            self._site.pop(attempt_id, None)
            self._wanted.pop(attempt_id, None)

    # -- the Launcher protocol ---------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> None:
        site = request.placement.site
        if site not in self._launchers:
            known = sorted(self._launchers)
            raise ValueError(f"site {site}: no launcher (the `sites` setting names {known})")
        if site in self._down():
            raise SiteDown(f"site {site} does not answer: attempt {request.attempt_id} waits for it")
        with self._lock:
            self._site[request.attempt_id] = site
        try:
            self._launchers[site].launch(request)
        except LaunchBusy:
            self._forget(request.attempt_id)
            raise  # nothing started
        except Exception:
            self._forget(request.attempt_id)
            raise
        with self._lock:
            self._wanted[request.attempt_id] = replace(request, launched_before=True)

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        found = self._launcher_of(attempt_id)
        targets = [found[1]] if found else list(self._reachable().values())
        for launcher in targets:
            launcher.cancel(attempt_id, grace_s=grace_s)

    def observe(self) -> list[WorkerReport]:
        reports = self._catch_up()
        for site, launcher in self._reachable().items():
            try:
                reports += launcher.observe()
            except Exception as error:  # its reports are repeated once it answers
                log.warning("site %s: observing its attempts failed: %s", site, error)
        return list(dict.fromkeys(reports))  # a catch-up's reports come again from observe

    def acknowledge(self, report: WorkerReport) -> None:
        try:
            found = self._launcher_of(report.attempt_id)
        except SiteDown:
            return  # repeated once the site answers
        for launcher in [found[1]] if found else list(self._reachable().values()):
            launcher.acknowledge(report)
        if report.outcome is not Outcome.RUNNING:
            self._forget(report.attempt_id)

    def alive(self) -> dict[str, int]:
        return {a: t for launcher in self._reachable().values() for a, t in launcher.alive().items()}

    def starting(self) -> dict[str, int]:
        return {a: t for launcher in self._reachable().values() for a, t in launcher.starting().items()}

    def release(self, attempt_id: str) -> bool:
        """True when nothing of it can run at any site; a site down may still run it (False): the
        attempt is no longer wanted there, so the reconcile that follows the site's return deletes it."""
        try:
            found = self._launcher_of(attempt_id)
        except SiteDown:
            self._forget(attempt_id)
            return False
        if found is None:  # not known here: every site must say so
            reachable = self._reachable()
            every = [self._release_at(site, launcher, attempt_id) for site, launcher in reachable.items()]
            return all(every) and len(reachable) == len(self._launchers)
        if released := self._release_at(*found, attempt_id):
            self._forget(attempt_id)
        return released

    @staticmethod
    def _release_at(site: str, launcher: Launcher, attempt_id: str) -> bool:
        try:
            return launcher.release(attempt_id)
        except Exception as error:  # not known stopped: the reaper asks again
            log.warning("site %s: releasing attempt %s failed: %s", site, attempt_id, error)
            return False

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        """Each site with its own live attempts; a site down is reconciled once it answers. A launched
        attempt placed at a site with no launcher cannot be reached any more: LOST."""
        reports: list[WorkerReport] = []
        with self._lock:
            self._site = {a: r.placement.site for a, r in live.items() if r.placement.site in self._launchers}
            self._wanted = {a: r for a, r in live.items() if a in self._site}
            self._behind = set(self._launchers)
        for attempt_id, request in live.items():
            if attempt_id not in self._site and request.launched_before:
                why = f"its site {request.placement.site} is not in the `sites` setting: it cannot be reached"
                report = WorkerReport(attempt_id, Outcome.LOST, self._clock(), reason=why, disrupted=True)
                reports.append(report)
        return reports + self._catch_up()

    def _catch_up(self) -> list[WorkerReport]:
        """Reconcile each site behind (never reconciled, or down since) that answers now."""
        reachable = self._reachable()
        with self._lock:
            due = sorted(self._behind & reachable.keys())
        reports: list[WorkerReport] = []
        for site in due:
            with self._lock:
                wanted = {a: r for a, r in self._wanted.items() if self._site.get(a) == site}
            try:
                reports += reachable[site].reconcile(wanted)
            except Exception as error:  # tried again on the next observe
                log.warning("site %s: reconciling its attempts failed: %s", site, error)
                continue
            with self._lock:
                self._behind.discard(site)
            log.info("site %s reconciled: %d attempt(s) wanted there", site, len(wanted))
        return reports

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        found = self._launcher_of(attempt_id)
        if found is not None:
            yield from found[1].logs(attempt_id, follow=follow)
            return
        for site, launcher in self._reachable().items():  # not known here (the API's reader): every site
            try:
                yield from launcher.logs(attempt_id, follow=follow)
            except Exception as error:
                log.warning("site %s: reading the logs of attempt %s failed: %s", site, attempt_id, error)

    def close(self) -> None:
        for launcher in self._launchers.values():
            close: Any = getattr(launcher, "close", None)
            if close is not None:
                close()
