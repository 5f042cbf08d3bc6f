"""Where an attempt runs: the nodes of ONE fast domain and the GPUs leased on each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeSlice:
    """The GPUs of one node given to one worker process group (one torchrun node) of the gang."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    site: str
    cluster: str
    domain: str
    slices: tuple[NodeSlice, ...]  # slice i runs node rank i; slice 0 hosts the rendezvous

    @property
    def gpus(self) -> int:
        return sum(len(s.gpu_indices) for s in self.slices)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.slices)

    def to_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "cluster": self.cluster,
            "domain": self.domain,
            "nodes": [{"node": s.node, "gpus": list(s.gpu_indices)} for s in self.slices],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Placement:
        return cls(
            site=data["site"],
            cluster=data["cluster"],
            domain=data["domain"],
            slices=tuple(NodeSlice(n["node"], tuple(n["gpus"])) for n in data["nodes"]),
        )
