"""The Kubernetes launcher runs real workers: the real scheduler over the launcher, on the emulated
cluster (deploy/local) whose binder places the pods and whose node agents run them as processes.

A job's worker checks what its pod hands it (its attempt's secret and fencing token from the attempt's
Secret, the platform's secret by reference, the team's object-store Secret, its HOME and /tmp on its
own volumes, the pod's user) and exits 0 only if all of it is there; the job then ends SUCCEEDED. A
worker that exits 3 fails its job with that exit code. Nothing here plays a kubelet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NAMESPACE, Cluster, detail, scheduler_on, step_until, submit
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.settings.kubernetes import KubernetesConfig
from local_cluster.agent import NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.images import python_image
from sqlalchemy import Engine

pytestmark = pytest.mark.slow  # real processes, real time

CHECKS = " && ".join(
    [
        'test -n "$GPUYARD_ATTEMPT_SECRET"',
        'test -n "$GPUYARD_FENCING_TOKEN"',
        'test "$MLFLOW_TRACKING_TOKEN" = mlflow-t0ken',
        'test "$AWS_ACCESS_KEY_ID" = team-a-key',
        'test "$(id -u)" = "$EXPECTED_UID"',
        'echo ok > "$HOME/written" && test -f "$HOME/written"',
        "touch /tmp/written",
    ]
)


def gpu_node(name: str, domain: str) -> NodeSpec:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    return NodeSpec(name, gpus=8, cpu="16", memory="64Gi", labels={**labels, "gpuyard.io/domain": domain})


@pytest.fixture
def emulated(tmp_path: Path, config: KubernetesConfig) -> Iterator[Cluster]:
    nodes = [gpu_node("gpu-a", "rack-1"), gpu_node("gpu-b", "rack-2")]
    with EmulatedCluster(nodes, {"registry.example/train": python_image()}, tmp_path / "nodes") as made:
        cluster = Cluster(made.server.emulator, made.server.loop, made.url)
        cluster.apply(m.build_team_namespace("a", 16, config))
        namespace = m.team_namespace("a", config)
        for name, values in {
            "mlflow": {"token": "mlflow-t0ken"},
            "object-store": {"AWS_ACCESS_KEY_ID": "team-a-key"},
        }.items():
            for where in (namespace, NAMESPACE):
                made.api.create_namespaced_secret(where, {"metadata": {"name": name}, "stringData": values})
        yield cluster


def test_a_job_s_worker_runs_in_its_pod_with_what_the_pod_hands_it(
    emulated: Cluster, config: KubernetesConfig, engine: Engine
) -> None:
    ok = submit(engine, ["sh", "-c", f"EXPECTED_UID={config.run_as_user}; {CHECKS}"])
    failing = submit(engine, ["sh", "-c", "exit 3"])
    with scheduler_on(emulated, config, engine) as service:
        step_until(
            service, lambda: detail(engine, ok).job.state.value == "SUCCEEDED", "the job to succeed", 60
        )
        step_until(
            service,
            lambda: any(a.state.value == "FAILED" for a in detail(engine, failing).attempts),
            "exit 3",
            60,
        )
    (attempt,) = detail(engine, ok).attempts
    assert attempt.state.value == "SUCCEEDED", attempt.reason
    assert "exited 3" in (detail(engine, failing).attempts[0].reason or "")
    pods = {p["metadata"]["name"]: p for p in emulated.pods()}
    assert all(p["spec"]["nodeName"] in ("gpu-a", "gpu-b") for p in pods.values())
    print(json.dumps({name: p["status"]["phase"] for name, p in pods.items()}))
