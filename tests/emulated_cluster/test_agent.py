"""The emulated cluster's node agents (local_cluster.agent) running real processes for the pods bound
to their nodes, through its API server over HTTP: environment and Secrets, volumes at their paths, the
pod's user, exit codes, graceful deletion, image pulls, and the faults a test sets."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_cluster.agent import NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.images import LocalImage, python_image
from servers import open_directory, wait_until

IMAGE = "registry.example/train"
NOBODY = 65534


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    images = {
        IMAGE: python_image(),
        "registry.example/slow": python_image(pull_s=1.0),
        "registry.example/broken": LocalImage(pull_error="unauthorized: authentication required"),
    }
    nodes = [NodeSpec("node-a", labels={"zone": "a"}), NodeSpec("node-b", labels={"zone": "b"})]
    with EmulatedCluster(nodes, images, tmp_path / "nodes", node_grace_s=1.0, report_every_s=0.2) as made:
        made.add_namespace("team-a")
        yield made


def run(cluster: EmulatedCluster, name: str, script: str, **spec: Any) -> None:
    container = {
        "name": "worker",
        "image": spec.pop("image", f"{IMAGE}:1@sha256:{'0' * 64}"),
        "command": ["sh", "-c", script],
        "env": spec.pop("env", []),
        "volumeMounts": spec.pop("mounts", []),
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"containers": [container], "restartPolicy": "Never", **spec},
    }
    cluster.api.create_namespaced_pod("team-a", pod)


def pod(cluster: EmulatedCluster, name: str) -> dict[str, Any] | None:
    found = [
        p
        for p in cluster.server.emulator.objects.values()
        if not p.deleted and p.raw["metadata"]["name"] == name
    ]
    return dict(found[0].raw) if found else None


def phase(cluster: EmulatedCluster, name: str) -> str | None:
    found = pod(cluster, name)
    return (found or {}).get("status", {}).get("phase")


def container_state(cluster: EmulatedCluster, name: str) -> dict[str, Any]:
    statuses = (pod(cluster, name) or {}).get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0].get("state") or {})


@pytest.fixture
def shared() -> Iterator[Path]:
    with open_directory() as directory:
        yield directory


def test_a_pod_runs_as_its_user_with_its_environment_secrets_and_volumes(
    cluster: EmulatedCluster, shared: Path
) -> None:
    cluster.api.create_namespaced_secret(
        "team-a", {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}, "type": "Opaque"}
    )
    script = (
        'id -u > "$OUT/uid"; echo "$PLAIN $TOKEN" > "$OUT/env"; echo hi > /scratch/file; '
        'ls /scratch > "$OUT/scratch"; [ -e /scratch/file ] && exit 3'
    )
    env = [
        {"name": "OUT", "value": str(shared)},
        {"name": "PLAIN", "value": "plain"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
    ]
    run(
        cluster,
        "p",
        script,
        env=env,
        mounts=[{"name": "scratch", "mountPath": "/scratch"}],
        volumes=[{"name": "scratch", "emptyDir": {}}],
        securityContext={"runAsUser": NOBODY, "runAsGroup": NOBODY},
        nodeSelector={"zone": "b"},
    )
    wait_until(lambda: phase(cluster, "p") == "Failed", what="the pod to end")
    found = pod(cluster, "p")
    assert found is not None and found["spec"]["nodeName"] == "node-b"
    assert container_state(cluster, "p")["terminated"]["exitCode"] == 3
    assert (shared / "uid").read_text().strip() == str(NOBODY)
    assert (shared / "env").read_text().strip() == "plain s3cret"
    assert (shared / "scratch").read_text().split() == ["file"]
    assert not Path("/scratch/file").exists()  # the volume was the pod's, mounted in its namespace only


def test_exit_codes_and_signals_are_reported_as_a_runtime_reports_them(cluster: EmulatedCluster) -> None:
    run(cluster, "ok", "exit 0")
    run(cluster, "killed", "kill -KILL $$")
    wait_until(lambda: phase(cluster, "ok") == "Succeeded", what="ok to succeed")
    assert container_state(cluster, "ok")["terminated"]["reason"] == "Completed"
    wait_until(lambda: phase(cluster, "killed") == "Failed", what="killed to fail")
    terminated = container_state(cluster, "killed")["terminated"]
    assert (terminated["exitCode"], terminated["signal"]) == (128 + signal.SIGKILL, signal.SIGKILL)


def test_a_deleted_pod_is_asked_to_stop_and_killed_after_its_grace_period(
    cluster: EmulatedCluster, shared: Path
) -> None:
    ready = f"touch {shared}/$NAME.ready; while :; do sleep 0.05; done"  # once its trap is set
    run(cluster, "polite", f'trap "echo term > {shared}/polite; exit 0" TERM; {ready}', env=[named("polite")])
    run(cluster, "deaf", f'trap "echo term > {shared}/deaf" TERM; {ready}', env=[named("deaf")])
    for name in ("polite", "deaf"):
        wait_until(lambda name=name: (shared / f"{name}.ready").exists(), what=f"{name} ready")
    cluster.api.delete_namespaced_pod("polite", "team-a", grace_period_seconds=30)
    cluster.api.delete_namespaced_pod("deaf", "team-a", grace_period_seconds=1)
    deleting = pod(cluster, "deaf")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")  # held by the agent
    wait_until(lambda: pod(cluster, "polite") is None, what="polite gone")
    assert (shared / "polite").read_text().strip() == "term"
    wait_until(lambda: pod(cluster, "deaf") is None, what="deaf killed and gone")
    assert (shared / "deaf").read_text().strip() == "term"  # it had its SIGTERM first


def test_an_evicted_pod_is_marked_a_disruption_target_then_stopped_with_its_grace_period(
    cluster: EmulatedCluster, shared: Path
) -> None:
    ready = f"touch {shared}/ready; while :; do sleep 0.05; done"
    script = f'trap "echo term > {shared}/evicted; exit 0" TERM; {ready}'
    run(cluster, "evicted", script, terminationGracePeriodSeconds=30)
    wait_until(lambda: (shared / "ready").exists(), what="the pod's TERM trap set")
    seen: list[dict[str, Any]] = []

    def condition() -> dict[str, Any] | None:
        found = pod(cluster, "evicted")
        if found is not None:
            seen.append(found)
        targets = [
            c
            for c in (found or {}).get("status", {}).get("conditions", [])
            if c["type"] == "DisruptionTarget"
        ]
        return targets[0] if targets else None

    cluster.evict("evicted", "team-a")
    target = wait_until(condition, what="the DisruptionTarget condition")
    assert target["status"] == "True" and target["reason"] == "EvictionByEvictionAPI"
    wait_until(lambda: pod(cluster, "evicted") is None, what="the evicted pod gone")
    assert (shared / "evicted").read_text().strip() == "term"  # stopped by SIGTERM, within its grace period
    marked = [
        "DisruptionTarget" in {c["type"] for c in p.get("status", {}).get("conditions", [])} for p in seen
    ]
    assert all(marked[marked.index(True) :]), "the agent's later reports dropped the condition"


def named(name: str) -> dict[str, str]:
    return {"name": "NAME", "value": name}


def test_image_pulls_take_their_time_or_fail_with_the_registry_s_reason(cluster: EmulatedCluster) -> None:
    run(cluster, "slow", "exit 0", image="registry.example/slow:2")
    run(cluster, "broken", "exit 0", image="registry.example/broken:1")
    run(cluster, "unknown", "exit 0", image="registry.example/nowhere:1")
    wait_until(lambda: container_state(cluster, "slow").get("waiting"), what="slow pulling")
    assert container_state(cluster, "slow")["waiting"]["reason"] == "ContainerCreating"
    wait_until(lambda: phase(cluster, "slow") == "Succeeded", what="slow to run once pulled")
    for name, why in (("broken", "unauthorized"), ("unknown", "manifest unknown")):
        wait_until(lambda name=name: container_state(cluster, name).get("waiting"), what=f"{name} refused")
        waiting = container_state(cluster, name)["waiting"]
        assert waiting["reason"] == "ErrImagePull" and why in waiting["message"]


def test_a_missing_secret_is_a_create_config_error(cluster: EmulatedCluster) -> None:
    env = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    run(cluster, "p", "exit 0", env=env)
    wait_until(lambda: container_state(cluster, "p").get("waiting"), what="the pod refused")
    waiting = container_state(cluster, "p")["waiting"]
    assert waiting == {"reason": "CreateContainerConfigError", "message": 'secret "absent" not found'}


def test_a_partitioned_node_goes_unknown_while_its_pods_run_and_a_lost_one_takes_them_down_till_replaced(
    cluster: EmulatedCluster, shared: Path
) -> None:
    beat = f"while :; do date +%s%N > {shared}/$NAME; sleep 0.05; done"
    run(cluster, "on-a", beat, env=[named("a")], nodeSelector={"zone": "a"})
    run(cluster, "on-b", beat, env=[named("b")], nodeSelector={"zone": "b"})
    for name in ("a", "b"):
        wait_until(lambda name=name: (shared / name).exists(), what=f"the pod on node-{name} running")
    cluster.agents["node-a"].partition()
    wait_until(lambda: ready(cluster, "node-a") == "Unknown", what="node-a Unknown")
    written = (shared / "a").read_text()
    wait_until(lambda: (shared / "a").read_text() != written, what="node-a's pod still running")
    assert phase(cluster, "on-a") == "Running"  # nothing reported, nothing decided
    cluster.agents["node-a"].heal()
    wait_until(lambda: ready(cluster, "node-a") == "True", what="node-a back")

    pids = [p.process.pid for p in cluster.agents["node-b"]._pods.values() if p.process]
    assert pids
    cluster.agents["node-b"].lose()
    assert not any(alive(pid) for pid in pids)  # they died with it (and were reaped)
    wait_until(lambda: ready(cluster, "node-b") == "Unknown", what="node-b Unknown")
    assert pod(cluster, "on-b") is not None  # what became of it is unknown until the node is removed
    cluster.api.delete_node("node-b")  # the operator's word that the machine is gone
    wait_until(lambda: pod(cluster, "on-b") is None, what="the lost node's pod collected")
    cluster.add_node(NodeSpec("node-c", labels={"zone": "b"}))  # a machine that replaces it joins
    run(cluster, "on-c", f"echo ran > {shared}/c", nodeSelector={"zone": "b"})
    wait_until(lambda: phase(cluster, "on-c") == "Succeeded", what="a pod on the new node")
    assert (pod(cluster, "on-c") or {})["spec"]["nodeName"] == "node-c"


def ready(cluster: EmulatedCluster, node: str) -> str:
    found = json.loads(cluster.api.read_node(node, _preload_content=False).data)
    return next(c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_nodes_shared_folder_is_seen_read_write_above_the_pods_volumes(
    tmp_path: Path, shared: Path
) -> None:
    """A shared file system every node mounts (`NodeSpec.shared`): a pod whose /tmp is a volume of its
    own still reads and writes a shared folder below /tmp (a checkout there, as `make demo-production`
    keeps its data root in it)."""
    (shared / "data").write_text("training set")
    nodes = [NodeSpec("node-s", shared=(str(shared),))]
    with EmulatedCluster(nodes, {IMAGE: python_image()}, tmp_path / "nodes", report_every_s=0.2) as made:
        made.add_namespace("team-a")
        run(
            made,
            "reader",
            f"cat {shared}/data > {shared}/seen; ls /tmp > {shared}/tmp",
            mounts=[{"name": "tmp", "mountPath": "/tmp"}],
            volumes=[{"name": "tmp", "emptyDir": {}}],
            securityContext={"runAsUser": NOBODY, "runAsGroup": NOBODY},
        )
        wait_until(lambda: phase(made, "reader") == "Succeeded", what="the pod to end")
    assert (shared / "seen").read_text() == "training set"
    assert (shared / "tmp").read_text().split() == [shared.parts[2]]  # its /tmp holds only the mount point
