"""The fleet read from the Kubernetes Nodes API: schedulable, Ready GPU nodes and what they offer.

`node_from_k8s` is pure (one Node object in, a fleet Node or None out); `fleet_from_nodes` does the
listing. Cordoned (`spec.unschedulable`) and not-Ready nodes are left out, as are nodes without
allocatable GPUs. GPU type, domain, cluster and site come from node labels named in the config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.units import parse_bytes, parse_cpu
from gpuyard.settings.kubernetes import KubernetesConfig


def dns_name(value: str, fallback: str) -> str:
    """A label value or node name turned into the DNS label that fleet names must be."""
    name = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:63].rstrip("-")
    return name or fallback


def _ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _taint(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint['key']}{value}:{taint.get('effect', '')}"


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def node_from_k8s(obj: Mapping[str, Any], config: KubernetesConfig) -> Node | None:
    """One fleet node from one Kubernetes Node object, or None when it cannot take GPU work now."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    if spec.get("unschedulable") or not _ready(status):
        return None
    allocatable = status.get("allocatable") or {}
    gpus = int(allocatable.get(config.gpu_resource, "0") or 0)
    if gpus <= 0:
        return None
    product = labels.get(config.gpu_type_label, "")
    gpu_type = config.gpu_type_aliases.get(product, product.lower()) or "unknown"
    memory_mib = _float(labels.get(config.gpu_memory_label))
    price = _float(annotations.get(config.price_label) or labels.get(config.price_label))
    name = meta.get("name", "")
    return Node(
        name=name,
        site=dns_name(labels.get(config.site_label, ""), config.default_site),
        cluster=dns_name(labels.get(config.cluster_label, ""), config.default_cluster),
        domain=dns_name(labels.get(config.domain_label, ""), dns_name(name, "node")),
        gpu_type=gpu_type,
        gpus=gpus,
        gpu_memory_gb=round(memory_mib / 1024, 1) if memory_mib else 0.0,
        cpu=parse_cpu(allocatable["cpu"]) if allocatable.get("cpu") else None,
        memory_gb=parse_bytes(allocatable["memory"]) / 2**30 if allocatable.get("memory") else None,
        labels=labels,
        taints=tuple(_taint(t) for t in spec.get("taints") or ()),
        price_per_gpu_hour=price if price is not None and price >= 0 else 0.0,
        preemptible=labels.get(config.preemptible_label, "").lower() == "true",
    )


def fleet_from_nodes(api: k8s.CoreV1Api, config: KubernetesConfig) -> Fleet:
    """The fleet as the Nodes API shows it now (the scheduler reads it again before each cycle)."""
    response = api.list_node(_preload_content=False, _request_timeout=config.request_timeout_s)
    items = json.loads(response.data).get("items") or ()
    nodes = [node for obj in items if (node := node_from_k8s(obj, config)) is not None]
    return Fleet(nodes=tuple(sorted(nodes, key=lambda node: node.name)))


def site_nodes(
    api: k8s.CoreV1Api, config: KubernetesConfig, site: str, data_prefixes: tuple[str, ...]
) -> tuple[Node, ...]:
    """The nodes of one site's Nodes API: each at that site whatever its site label says, and reading
    the site's data unless it names its own."""
    return tuple(
        node.model_copy(update={"site": site, "data_prefixes": node.data_prefixes or data_prefixes})
        for node in fleet_from_nodes(api, config).nodes
    )
