"""The emulated cluster's binder (local_cluster.binder) against its API server over HTTP: pods bound as
kube-scheduler would, the rest Pending with its reason until room appears."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from local_cluster.apiserver import ApiServer
from local_cluster.binder import Binder
from servers import wait_until

from .test_scheduling import node, pinned, pod


@pytest.fixture
def api() -> Iterator[k8s.CoreV1Api]:
    server = ApiServer()
    server.emulator.namespaces["team-a"] = {}
    configuration = k8s.Configuration()
    configuration.host = server.url
    try:
        yield k8s.CoreV1Api(k8s.ApiClient(configuration))
    finally:
        server.stop()


def create(api: k8s.CoreV1Api, obj: dict[str, Any], kind: str) -> None:
    body = {"apiVersion": "v1", "kind": kind, **obj}
    if kind == "Node":
        api.create_node(body)
    else:
        body["metadata"]["namespace"] = "team-a"
        api.create_namespaced_pod("team-a", body)


def read(api: k8s.CoreV1Api, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(api.read_namespaced_pod(name, "team-a", _preload_content=False).data)
    return found


def test_pods_are_bound_in_order_and_what_does_not_fit_waits_with_its_reason(api: k8s.CoreV1Api) -> None:
    for name in ("gpu-a", "gpu-b"):
        create(api, node(name, gpus=2), "Node")
    binder = Binder(api)
    create(api, pod("first", gpus=2, affinity=pinned("gpu-b")), "Pod")
    create(api, pod("second", gpus=2, affinity=pinned("gpu-b")), "Pod")
    create(api, pod("third", gpus=1), "Pod")
    assert binder.bind_pending() == 2
    assert read(api, "first")["spec"]["nodeName"] == "gpu-b"
    assert read(api, "third")["spec"]["nodeName"] == "gpu-a"
    waiting = read(api, "second")
    assert "nodeName" not in waiting["spec"]
    (condition,) = waiting["status"]["conditions"]
    assert condition == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
        "1 node(s) didn't match Pod's node affinity/selector.",
    }
    version = waiting["metadata"]["resourceVersion"]
    assert binder.bind_pending() == 0
    assert read(api, "second")["metadata"]["resourceVersion"] == version  # the same reason is not rewritten

    api.patch_namespaced_pod_status("first", "team-a", {"status": {"phase": "Succeeded"}})
    assert binder.bind_pending() == 1  # level-triggered: the room the ended pod left
    assert read(api, "second")["spec"]["nodeName"] == "gpu-b"


def test_the_binder_runs_until_stopped(api: k8s.CoreV1Api) -> None:
    create(api, node("gpu-a"), "Node")
    binder = Binder(api, every_s=0.02).start()
    try:
        create(api, pod("p"), "Pod")
        wait_until(lambda: read(api, "p")["spec"].get("nodeName"), what="the pod bound")
        assert read(api, "p")["spec"]["nodeName"] == "gpu-a"
    finally:
        binder.stop()
