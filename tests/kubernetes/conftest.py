"""Fixtures for the Kubernetes launcher tests: the emulated cluster's API server (deploy/local,
`local_cluster.apiserver`: kmock's emulator on a real HTTP port), with the test playing kube-scheduler
and the kubelets through the API (`Cluster`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from gpuyard.clock import utcnow
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.spec import parse_spec
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.launchers.kubernetes.fleet import fleet_from_nodes
from gpuyard.launchers.kubernetes.launcher import KubernetesLauncher
from gpuyard.scheduler.service import SchedulerService
from gpuyard.settings.kubernetes import KubernetesConfig
from gpuyard.store import jobs as job_store
from gpuyard.store import teams as team_store
from gpuyard.store.db import make_engine
from gpuyard.store.jobs import JobDetail
from kmock import action
from kubernetes import client as k8s
from local_cluster.apiserver import ApiServer, ApiServerEmulator, write_kubeconfig
from servers import wait_until
from sqlalchemy import Engine

NAMESPACE = "gpuyard"  # the control plane's
KUBELET_FINALIZER = "kubelet.test/terminating"  # holds a deleted pod for its grace period


class Cluster:
    """A running emulator and a real `kubernetes` client pointed at it."""

    def __init__(self, emulator: ApiServerEmulator, loop: asyncio.AbstractEventLoop, url: str):
        self.emulator = emulator
        self.loop = loop
        self.url = url
        configuration = k8s.Configuration()
        configuration.host = url
        self.api = k8s.CoreV1Api(k8s.ApiClient(configuration))
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.emulator.apply(self.api.api_client, objects)

    def write_kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(self.url, path)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def pods(self) -> list[dict[str, Any]]:
        return self.objects("pods")

    def objects(self, plural: str) -> list[dict[str, Any]]:
        return [
            dict(obj.raw)
            for (res, _, _), obj in self.emulator.objects.items()
            if res.plural == plural and not obj.deleted
        ]

    def requests(self, verb: str, plural: str) -> list[Any]:
        return [
            r
            for r in self.emulator.requests
            if r.action == action(verb) and r.resource is not None and r.resource.plural == plural
        ]

    # Kubelet and node controller, played through the API as they would play it.
    def set_pod_status(self, name: str, status: dict[str, Any]) -> None:
        (namespace,) = [p["metadata"]["namespace"] for p in self.pods() if p["metadata"]["name"] == name]
        self.api.patch_namespaced_pod_status(name, namespace, {"status": status}, _preload_content=False)

    def bind(self, name: str) -> None:
        """kube-scheduler's part: bind the pod to the node its required affinity names."""
        (pod,) = [p for p in self.pods() if p["metadata"]["name"] == name]
        node = pod["metadata"]["annotations"][m.NODE_ANNOTATION]
        self._patch_pod(name, {"spec": {"nodeName": node}})

    def hold_termination(self, name: str) -> None:
        """The pod takes its grace period to stop, as a kubelet's pod does: a delete only marks it
        (deletionTimestamp), until `finish_termination` (a finalizer stands for the kubelet)."""
        self._patch_pod(name, {"metadata": {"finalizers": [*self._finalizers(name), KUBELET_FINALIZER]}})

    def finish_termination(self, name: str) -> None:
        """The pod's containers have stopped: the kubelet lets it go (the launcher's finalizer, if it
        still holds one, keeps it until the launcher has read its outcome)."""
        kept = [f for f in self._finalizers(name) if f != KUBELET_FINALIZER]
        self._patch_pod(name, {"metadata": {"finalizers": kept or None}})

    def _finalizers(self, name: str) -> list[str]:
        (pod,) = [p for p in self.pods() if p["metadata"]["name"] == name]
        return list(pod["metadata"].get("finalizers") or [])

    def _patch_pod(self, name: str, patch: dict[str, Any]) -> None:
        (namespace,) = [p["metadata"]["namespace"] for p in self.pods() if p["metadata"]["name"] == name]
        self.api.patch_namespaced_pod(name, namespace, patch, _preload_content=False)

    def add_node(self, name: str, **overrides: Any) -> None:
        self.api.create_node(node(name, **overrides))


def node(
    name: str,
    *,
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    domain: str = "rack-1",
    ready: str = "True",
    unschedulable: bool = False,
    spot: bool = False,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": "81559",
                "gpuyard.io/domain": domain,
                "gpuyard.io/cluster": "c1",
                "topology.kubernetes.io/region": "eu-west",
                **({"gpuyard.io/spot": "true"} if spot else {}),
                **(labels or {}),
            },
            "annotations": {"gpuyard.io/price-per-gpu-hour": "2.5"},
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": {
                "cpu": "95900m",
                "memory": "1056000000Ki",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "capacity": {"cpu": "96", "memory": "1056300000Ki", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}],
        },
    }


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server = ApiServer()
    try:
        yield Cluster(server.emulator, server.loop, server.url)
    finally:
        server.stop()


@pytest.fixture
def config() -> KubernetesConfig:
    return KubernetesConfig(
        namespace=NAMESPACE,
        in_cluster=False,
        image_pull_secrets=("registry",),
        env_from_secrets=("object-store",),
        secret_env={"MLFLOW_TRACKING_TOKEN": "mlflow/token"},
        termination_grace_s=30,
        watch_timeout_s=1,
        request_timeout_s=5,
    )


def assert_valid(obj: dict[str, Any]) -> None:
    """Valid against the Kubernetes 1.37 schemas, strictly (unknown fields are errors)."""
    kubernetes_validate.validate(obj, "1.37.0", strict=True)


# The real scheduler and store (SQLite) over the launcher, for the tests that run both.
LEASE_S = 2.0


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        team_store.set_quota(conn, "a", TeamQuota(gpu_quota=16, max_gpus_per_job=8), utcnow())
    yield engine
    engine.dispose()


@pytest.fixture
def team_fleet(cluster: Cluster, config: KubernetesConfig) -> None:
    """Two Ready 8-GPU nodes in two racks, and team a's namespace."""
    cluster.add_node("gpu-a", domain="rack-1")
    cluster.add_node("gpu-b", domain="rack-2")
    cluster.apply(m.build_team_namespace("a", 16, config))


@pytest.fixture
def service(
    cluster: Cluster, config: KubernetesConfig, engine: Engine, team_fleet: None
) -> Iterator[SchedulerService]:
    with scheduler_on(cluster, config, engine) as service:
        yield service


@contextmanager
def scheduler_on(cluster: Cluster, config: KubernetesConfig, engine: Engine) -> Iterator[SchedulerService]:
    """The scheduler over a Kubernetes launcher of `config`, leases of LEASE_S."""
    with KubernetesLauncher(config, cluster.api, teams=lambda: ["a"], backoff_s=0.05) as launcher:
        yield SchedulerService(
            engine,
            launcher,
            lambda: fleet_from_nodes(cluster.api, config),
            api_url=lambda: "http://api",
            lease_ttl_s=LEASE_S,
            grace_s=0,
        )


def submit(engine: Engine, command: list[str]) -> str:
    spec = {
        "name": "plain",
        "team": "a",
        "image": "registry.example/train:1",
        "command": command,
        "resources": {"gpus": 8, "gpu_types": ["h100"]},
    }
    job, _ = job_store.submit(engine, parse_spec(spec), idempotency_key=None, created_by="t", at=utcnow())
    return job.id


def detail(engine: Engine, job_id: str) -> JobDetail:
    found = job_store.detail(engine, job_id)
    assert found is not None
    return found


def pods_of(cluster: Cluster, attempt_id: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in cluster.pods()
        if (p["metadata"].get("annotations") or {}).get(m.ATTEMPT_ID_ANNOTATION) == attempt_id
    ]


@contextmanager
def clock_stopped(service: SchedulerService) -> Iterator[None]:
    """The scheduler's clock stands still while the test's kubelet brings pods up: a kubelet takes
    milliseconds, a test's steps between a reservation and its pods running can take a loaded
    machine longer than the tests' short lease (LEASE_S)."""
    clock, at = service.clock, service.clock()
    service.clock = lambda: at
    try:
        yield
    finally:
        service.clock = clock


def step_until(service: SchedulerService, condition: object, what: str, timeout_s: float = 15.0) -> None:
    def stepped() -> object:
        service.step()
        return condition()  # type: ignore[operator]

    wait_until(stepped, timeout_s=timeout_s, interval_s=0.1, what=what)
