"""The fleet read from the Nodes API of the emulator: labels mapped, cordoned and not-Ready nodes left out."""

from __future__ import annotations

from conftest import Cluster
from gpuyard.launchers.kubernetes.fleet import fleet_from_nodes
from gpuyard.settings.kubernetes import KubernetesConfig


def test_fleet_from_nodes(cluster: Cluster, config: KubernetesConfig) -> None:
    cluster.add_node("gpu-a", domain="nvl-1")
    cluster.add_node(
        "gpu-b",
        domain="nvl-1",
        spot=True,
        gpus=4,
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )
    cluster.add_node("gpu-cordoned", unschedulable=True)
    cluster.add_node("gpu-notready", ready="False")
    cluster.add_node("gpu-unknown", ready="Unknown")
    cluster.add_node("cpu-only", gpus=0)
    cluster.add_node("gpu-7.dc1.example.com", product="Tesla-T4", labels={"gpuyard.io/domain": ""})

    fleet = fleet_from_nodes(cluster.api, config)

    assert [n.name for n in fleet.nodes] == ["gpu-7.dc1.example.com", "gpu-a", "gpu-b"]
    a, b = fleet.nodes[1], fleet.nodes[2]
    assert (a.site, a.cluster, a.domain, a.gpu_type, a.gpus) == ("eu-west", "c1", "nvl-1", "h100", 8)
    assert a.gpu_memory_gb == 79.6 and a.cpu == 95.9 and a.price_per_gpu_hour == 2.5 and not a.preemptible
    assert b.preemptible and b.gpus == 4 and b.taints == ("nvidia.com/gpu=present:NoSchedule",)
    odd = fleet.nodes[0]
    assert odd.gpu_type == "tesla-t4"  # no alias: the product lowercased
    assert (
        odd.domain == "gpu-7-dc1-example-com"
    )  # no domain label: a domain of its own, never shared by accident
    assert set(fleet.domains()) == {("eu-west", "c1", "nvl-1"), ("eu-west", "c1", "gpu-7-dc1-example-com")}
