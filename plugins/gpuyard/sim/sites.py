"""Sites in the simulator: a fleet of several sites, each team's home site, the checkpoint a job
moves, and site events (a site losing part of its nodes for a while).

The engine (`engine.Simulator`, `SimConfig.sites`) reads a `SiteModel`: the WAN between the sites
(`domain.sites.Wan`), the home site of every team, the checkpoint size of a job (16 bytes per
parameter, the parameters from its GPU count by `PARAMS_BY_GPUS`), the data a job reads at its home
site, and the site events. The policies
decide where jobs go (`scheduler/sites.py`); the engine charges what a move costs. docs/simulator.md,
"Sites", states the model and its assumptions.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.sites import Wan
from gpuyard.sim.fleet_builder import standard_fleet
from gpuyard.sim.trace import TraceJob

# A job's model size from its GPU count: the entry of the largest count at or below it (a step, not
# an interpolation: 12 GPUs train a 7B model). An assumption of the benchmark, not a fact of Philly,
# whose trace names no model: people size a model to the GPUs they ask for.
PARAMS_BY_GPUS: tuple[tuple[int, float], ...] = (
    (1, 1e9),
    (2, 2e9),
    (4, 3e9),
    (8, 7e9),
    (16, 13e9),
    (32, 30e9),
    (64, 70e9),
)
# Mixed-precision Adam: 16-bit weights and gradients, fp32 master weights and two moments (2 + 2 +
# 12), as ZeRO counts it. The planner (`planner.checkpoint_bytes`) counts 14, without gradients.
BYTES_PER_PARAM = 16.0


def parameters(gpus: int, table: Sequence[tuple[int, float]] = PARAMS_BY_GPUS) -> float:
    """The parameters of a job of `gpus` GPUs: the table's entry of the largest count <= `gpus`."""
    if gpus < 1:
        raise ValueError(f"a job has at least 1 GPU, got {gpus}")
    below = [params for count, params in table if count <= gpus]
    if not below:
        raise ValueError(f"the parameter table starts at {min(c for c, _ in table)} GPUs; a job asks {gpus}")
    return below[-1]


def _check_table(table: Sequence[tuple[int, float]]) -> None:
    counts = [count for count, _ in table]
    if not table or counts != sorted(set(counts)) or counts[0] < 1:
        raise ValueError(f"the parameter table needs rising GPU counts from >= 1, got {counts}")
    bad = [params for _, params in table if not (math.isfinite(params) and params > 0)]
    if bad:
        raise ValueError(f"the parameter table needs parameters > 0, got {bad[0]!r}")


# -- the home site of each team ---------------------------------------------------------------------

Split = Callable[[Sequence[TraceJob], Sequence[str]], dict[str, str]]


def split_by_gpu_time(jobs: Sequence[TraceJob], sites: Sequence[str]) -> dict[str, str]:
    """Each team to a site so that the sites get about equal GPU-time of the trace: teams by GPU-time,
    largest first (ties by name), each to the site with the least so far (ties: the first site)."""
    demand: dict[str, float] = defaultdict(float)
    for job in jobs:
        demand[job.team] += job.duration_s * job.gpus
    load = dict.fromkeys(sites, 0.0)
    home = {}
    for team in sorted(demand, key=lambda t: (-demand[t], t)):
        site = min(sites, key=lambda s: load[s])  # the first of equals
        home[team] = site
        load[site] += demand[team]
    return home


def split_alternating(jobs: Sequence[TraceJob], sites: Sequence[str]) -> dict[str, str]:
    """Teams sorted by name, dealt to the sites in turn."""
    return {team: sites[i % len(sites)] for i, team in enumerate(sorted({job.team for job in jobs}))}


SPLITS: dict[str, Split] = {"gpu_time": split_by_gpu_time, "alternate": split_alternating}


def home_sites(jobs: Sequence[TraceJob], sites: Sequence[str], rule: str = "gpu_time") -> dict[str, str]:
    """The home site of every team of `jobs`, by the named rule of `SPLITS`."""
    if rule not in SPLITS:
        raise ValueError(f"unknown split rule {rule!r}; expected one of {sorted(SPLITS)}")
    if not sites or len(set(sites)) != len(sites):
        raise ValueError(f"the split needs distinct site names, got {list(sites)}")
    return SPLITS[rule](jobs, sites)


# -- fleets and events ------------------------------------------------------------------------------


def site_fleet(
    sites: Sequence[str],
    nodes_per_site: int,
    nodes_per_domain: int = 4,
    preemptible_nodes: int | None = None,
) -> Fleet:
    """At each site the standard fleet of `nodes_per_site` nodes (`fleet_builder.standard_fleet`: the
    same domains and spot nodes at each), its nodes named `<site>-nNNNN`, one cluster named as the
    site."""
    if not sites or len(set(sites)) != len(sites):
        raise ValueError(f"a fleet of sites needs distinct site names, got {list(sites)}")
    nodes: list[Node] = []
    for site in sites:
        one = standard_fleet(
            nodes_per_site, nodes_per_domain=nodes_per_domain, preemptible_nodes=preemptible_nodes
        )
        nodes += [
            n.model_copy(update={"name": f"{site}-{n.name}", "site": site, "cluster": site})
            for n in one.nodes
        ]
    return Fleet(nodes=tuple(nodes))


@dataclass(frozen=True)
class SiteEvent:
    """From `start` to `end`, `fraction` of the site's nodes are down: the first of them in fleet
    order (with the standard fleet, whole domains of on-demand nodes first). Attempts on them are
    lost as at a node interruption; they come back at `end`."""

    site: str
    start: datetime
    end: datetime
    fraction: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"site event at {self.site}: ends ({self.end}) before it starts ({self.start})")
        if not 0 < self.fraction <= 1:
            raise ValueError(
                f"site event at {self.site}: fraction of nodes down must be in (0, 1], got {self.fraction!r}"
            )

    def nodes(self, fleet: Fleet) -> list[str]:
        """The names of the nodes it takes down."""
        at_site = [n.name for n in fleet.nodes if n.site == self.site]
        if not at_site:
            raise ValueError(
                f"site event at {self.site!r}: the fleet has no such site; it has {sorted(fleet.site_names)}"
            )
        return at_site[: max(1, round(self.fraction * len(at_site)))]


@dataclass(frozen=True)
class SiteModel:
    """What the engine needs of sites: the WAN, each team's home, the checkpoint size, the events."""

    wan: Wan
    home: Mapping[str, str]  # team -> site
    events: tuple[SiteEvent, ...] = ()
    params_by_gpus: tuple[tuple[int, float], ...] = PARAMS_BY_GPUS
    bytes_per_param: float = BYTES_PER_PARAM
    # The bytes of data (and image) each job reads, held at its home site: an attempt at another site
    # stages them first (`PendingJob.data`, the service's rule); 0: they are at every site already.
    staging_bytes: float = 0.0

    def __post_init__(self) -> None:
        _check_table(self.params_by_gpus)
        if not (math.isfinite(self.bytes_per_param) and self.bytes_per_param > 0):
            raise ValueError(f"bytes per parameter must be > 0, got {self.bytes_per_param!r}")
        if not (math.isfinite(self.staging_bytes) and self.staging_bytes >= 0):
            raise ValueError(f"staging bytes must be >= 0, got {self.staging_bytes!r}")

    def checkpoint_bytes(self, gpus: int) -> float:
        """The checkpoint of a job of `gpus` GPUs (the trace's count): bytes per parameter x its
        parameters."""
        return self.bytes_per_param * parameters(gpus, self.params_by_gpus)

    def home_of(self, team: str) -> str:
        site = self.home.get(team)
        if site is None:
            raise ValueError(f"team {team!r} has no home site; the site model names {sorted(self.home)}")
        return site

    def check(self, fleet: Fleet) -> None:
        """Every home site and every event's site is a site of `fleet`."""
        sites = fleet.site_names
        unknown = sorted({s for s in self.home.values() if s not in sites})
        if unknown:
            raise ValueError(f"home site(s) {unknown} are not sites of the fleet, which has {sorted(sites)}")
        for event in self.events:
            event.nodes(fleet)


def peak_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most of the (start, end) intervals under way at one instant (one ending as another
    starts: not both)."""
    edges = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak
