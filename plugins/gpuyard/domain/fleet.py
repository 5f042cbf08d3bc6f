"""The fleet: sites -> clusters -> fast interconnect domains -> nodes, and what it can ever offer."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from gpuyard.domain.checkpoint_roots import CheckpointRoot, CheckpointStores
from gpuyard.domain.spec import Name


class Node(BaseModel):
    """One machine. `domain` names its fast interconnect island (NVLink/InfiniBand) in its cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrictStr
    site: Name
    cluster: Name
    domain: Name
    gpu_type: StrictStr
    gpus: StrictInt = Field(ge=0)
    gpu_memory_gb: StrictFloat | StrictInt = Field(0, ge=0)
    cpu: StrictFloat | StrictInt | None = Field(None, gt=0, description="Allocatable CPUs; null: not known.")
    memory_gb: StrictFloat | StrictInt | None = Field(
        None, gt=0, description="Allocatable memory in GiB; null: not known (neither is then checked)."
    )
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    taints: tuple[StrictStr, ...] = ()
    price_per_gpu_hour: StrictFloat | StrictInt = Field(0.0, ge=0)
    preemptible: StrictBool = False
    mtbi_hours: StrictFloat | StrictInt | None = Field(
        None,
        gt=0,
        description="Expected mean time between interruptions; default 24 h spot, 720 h otherwise.",
    )
    data_prefixes: tuple[StrictStr, ...] = Field(
        (), description="URL prefixes of the data this node can read; empty reaches all data."
    )

    @property
    def expected_mtbi_s(self) -> float:
        return 3600.0 * (self.mtbi_hours or (24.0 if self.preemptible else 720.0))

    @property
    def domain_key(self) -> tuple[str, str, str]:
        """Domains are named within their cluster, which is named within its site."""
        return (self.site, self.cluster, self.domain)


def holds_host_resources(node: Node, cpu: float, memory_gb: float) -> bool:
    """`node` has this much CPU and memory to give, as far as it says (an unknown amount is not held
    against it)."""
    return (node.cpu is None or node.cpu >= cpu) and (node.memory_gb is None or node.memory_gb >= memory_gb)


class Site(BaseModel):
    """A datacenter: where its checkpoints live. Runs never span sites; checkpoints move between them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Name
    checkpoint_store: CheckpointRoot = Field(
        description="fsspec URL under which checkpoints are kept here; a team's default root is "
        "<store>/<team>."
    )


class Fleet(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: tuple[Node, ...]
    sites: tuple[Site, ...] = ()

    def site(self, name: str) -> Site | None:
        return next((s for s in self.sites if s.name == name), None)

    def domains(self) -> dict[tuple[str, str, str], list[Node]]:
        grouped: dict[tuple[str, str, str], list[Node]] = defaultdict(list)
        for node in self.nodes:
            grouped[node.domain_key].append(node)
        return dict(grouped)

    @property
    def gpu_types(self) -> frozenset[str]:
        return frozenset(node.gpu_type for node in self.nodes)

    @property
    def site_names(self) -> frozenset[str]:
        return frozenset(node.site for node in self.nodes)

    def checkpoint_stores(self, default: str | None = None, *, required: bool = False) -> CheckpointStores:
        """Its sites' checkpoint stores, `default` for the other sites; `required`: a team without
        roots may not checkpoint (domain/checkpoint_roots.py)."""
        by_site = {site.name: site.checkpoint_store for site in self.sites}
        return CheckpointStores(by_site, default, self.site_names | by_site.keys(), required)


def load_fleet(path: Path) -> Fleet:
    """Read a fleet YAML file: `{nodes: [...]}`. Errors name the file and the field."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"fleet file {path}: {error}") from error
    try:
        return Fleet.model_validate(data)
    except Exception as error:
        raise ValueError(f"fleet file {path}: {error}") from error


def local_fleet(slots: int, gpu_type: str = "cpu", gpu_memory_gb: float = 0.0) -> Fleet:
    """The embedded default: this machine as one node, one domain, one site."""
    return Fleet(
        nodes=(
            Node(
                name="local",
                site="local",
                cluster="local",
                domain="local",
                gpu_type=gpu_type,
                gpus=slots,
                gpu_memory_gb=gpu_memory_gb,
            ),
        )
    )
