"""Admission checks of a JobSpec against the fleet (can it EVER run?) and the team's quota.

Pure functions: they return every violation found, each with a field path and the rule.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.domain.fleet import Fleet, Node, holds_host_resources
from gpuyard.domain.spec import JobSpec, SpecViolation, Text


class TeamQuota(BaseModel):
    """A team's admission limits (Kueue: its ClusterQueue). `gpu_quota` is nominal concurrent GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Bounded like a job's GPUs (and far below what the store's integer columns hold).
    max_gpus_per_job: int = Field(8, ge=0, le=4096)
    allowed_gpu_types: tuple[Text, ...] = Field((), description="Empty allows every type.")
    gpu_quota: int = Field(8, ge=0, le=1_000_000)
    cohort: Text | None = Field(None, max_length=63)  # the store's column
    # Finite and bounded: an infinite weight made every fair-share figure NaN (a 500 for everyone).
    weight: float = Field(1.0, gt=0, le=1000, allow_inf_nan=False)


def check_quota(spec: JobSpec, quota: TeamQuota) -> list[SpecViolation]:
    """An elastic job is admitted on the most it may hold (`gpus_max`); its quota use is what it holds
    (the placement's GPUs, scheduler/cycle.py `admit`)."""
    violations = []
    if spec.resources.gpus_max > quota.max_gpus_per_job:
        asked = "a range up to " if spec.resources.elastic else ""
        violations.append(
            SpecViolation(
                path="resources.gpus",
                rule=f"team {spec.team} may use at most {quota.max_gpus_per_job} GPUs per job, "
                f"asked for {asked}{spec.resources.gpus_max}",
            )
        )
    if quota.allowed_gpu_types:
        # An empty gpu_types ("any") is admitted: placement only offers the team's allowed types.
        refused = [t for t in spec.resources.gpu_types if t not in quota.allowed_gpu_types]
        if refused:
            violations.append(
                SpecViolation(
                    path="resources.gpu_types",
                    rule=f"team {spec.team} may use GPU types {list(quota.allowed_gpu_types)}, not {refused}",
                )
            )
    return violations


def _fits_node(spec: JobSpec, node: Node) -> bool:
    """At the job's largest size (an elastic job's `max`; every smaller size fits where it does)."""
    res = spec.resources
    return (
        (not res.gpu_types or node.gpu_type in res.gpu_types)
        and node.gpus >= res.gpus_max // res.nodes
        and (res.gpu_memory_bytes is None or node.gpu_memory_gb * 2**30 >= res.gpu_memory_bytes)
        and holds_host_resources(node, res.cpu_cores, res.memory_gib)
        and (not spec.sites or node.site in spec.sites)
    )


def check_feasible(spec: JobSpec, fleet: Fleet) -> list[SpecViolation]:
    """Could the whole gang ever fit inside ONE fast domain of this fleet, on an empty fleet? An
    elastic job is checked at its largest size (`gpus_max`): a range it could never grow to the top
    of is refused rather than kept as a promise the fleet cannot keep, and its smaller sizes fit
    wherever the largest does (the same nodes, fewer GPUs on each)."""
    res = spec.resources
    largest, per_node = res.gpus_max, res.gpus_max // res.nodes
    typed = [n for n in fleet.nodes if not res.gpu_types or n.gpu_type in res.gpu_types]
    if not typed:
        return [
            SpecViolation(
                path="resources.gpu_types",
                rule=f"no node in the fleet has GPU type {list(res.gpu_types)}; "
                f"the fleet has {sorted(fleet.gpu_types)}",
            )
        ]
    if spec.sites and not any(n.site in spec.sites for n in typed):
        return [
            SpecViolation(
                path="sites",
                rule=f"none of the allowed sites {list(spec.sites)} has GPU type {list(res.gpu_types)}; "
                f"sites with it: {sorted({n.site for n in typed})}",
            )
        ]
    largest_node = max(n.gpus for n in typed)
    if per_node > largest_node:
        return [
            SpecViolation(
                path="resources.gpus",
                rule=f"{largest} GPUs over {res.nodes} node(s) needs {per_node} GPUs per node, "
                f"but the largest node of the accepted types has {largest_node}",
            )
        ]
    memory = res.gpu_memory_bytes
    if memory is not None and not any(n.gpu_memory_gb * 2**30 >= memory for n in typed):
        best = max(n.gpu_memory_gb for n in typed)
        return [
            SpecViolation(
                path="resources.gpu_memory",
                rule=f"asks for {memory / 2**30:g} GiB per GPU; the most any accepted node has is {best:g}",
            )
        ]
    for path, asked, unit, has in (
        ("resources.cpu", res.cpu_cores, "CPUs", lambda n: n.cpu),
        ("resources.memory", res.memory_gib, "GiB of memory", lambda n: n.memory_gb),
    ):
        known = [has(n) for n in typed if has(n) is not None]
        if asked and len(known) == len(typed) and max(known) < asked:
            return [
                SpecViolation(
                    path=path,
                    rule=f"asks for {asked:g} {unit} per node; the most any accepted node has is "
                    f"{max(known):g}",
                )
            ]
    best_domain = 0
    for nodes in fleet.domains().values():
        fitting = sum(1 for n in nodes if _fits_node(spec, n))
        best_domain = max(best_domain, fitting)
        if fitting >= res.nodes:
            return []
    return [
        SpecViolation(
            path="resources.nodes",
            rule=f"a gang of {res.nodes} nodes x {per_node} GPUs must fit in ONE fast domain, "
            f"but the largest domain offers {best_domain} such node(s)",
        )
    ]


def check_data_sites(spec: JobSpec, fleet: Fleet) -> list[SpecViolation]:
    """Every site its data names is a site of the fleet: a misspelt one would hold nothing, and every
    start would be charged the staging of that data."""
    named = [(i, site) for i, data in enumerate(spec.data) for site in data.sites]
    if not named:
        return []
    sites = fleet.site_names
    return [
        SpecViolation(
            path=f"data.{i}.sites", rule=f"the fleet has no site {site!r}; its sites: {sorted(sites)}"
        )
        for i, site in named
        if site not in sites
    ]
