"""The emulated cluster under a fault campaign (`--launcher kubernetes`): node agents run the suite's
workers in pods (deploy/local), the control plane's Kubernetes launcher reaches the cluster's API
server through a fault link, and the faults of a cluster itself strike beside the control plane's.

- `Pods`: the cluster (nodes of 2 GPUs of type `cpu`; the run directory shared by every node, as a
  cluster's file system is, so the journal's socket and the checkpoint store are the pods' too), the
  link to its API server, and how each pod's container ended (`exits`), read from the API server as
  a kubelet reports it.
- `CLUSTER_FAULTS`: a node lost (a machine joins in its place), a node partitioned from the API server
  (its pods run on and heartbeat), a node and its pods cut from every network (they run on, unheard),
  a node NotReady past the lifecycle's grace then back, slow and
  failing image pulls, an eviction, a pod deleted behind the launcher's back, the API server's link
  cut or black-holed.

Each pod has a network namespace of its own on the cluster's bridge (a gang's ranks meet at their
Service's names); the pods reach the links (gpuyard's API, the object store) where they listen, at the
suite's gateway, as a cluster's pods reach Services. The workers run as the launcher's `run_as_user`,
not root: the journal's socket is open to them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from gpuyard.launchers.kubernetes.manifests import RANK_LABEL
from local_cluster.agent import NodeSpec
from local_cluster.apiserver import write_kubeconfig
from local_cluster.cluster import EmulatedCluster
from local_cluster.control_plane import OBJECT_STORE_SECRET, object_store_secret
from local_cluster.images import LocalImage, python_image, repository
from local_cluster.services import S3Server

from . import workload
from .faults import FAULTS, Fault, Target, degrade, running_attempts
from .proxy import FaultProxy

REPO = Path(__file__).resolve().parents[2]
GPUS_PER_NODE = 2
NODES = 2  # as the local campaign's fleet: 4 GPUs; a lost node's replacement keeps it so
NODE_GRACE_S = 8.0  # the lifecycle controller's: a node unreported this long is NotReady
NAMESPACE = "gpuyard"
BUCKET = "checkpoints"
POLL_S = 0.5


class Pods:
    """The emulated cluster of one campaign; `start()` first, `stop()` undoes it."""

    def __init__(self, run: Path, listen: str, api: tuple[str, int]):
        """`listen`: where the links listen (the components' gateway, which the pods reach too);
        `api`: the gpuyard API's address, which the pods reach through a link of their own."""
        self.run, self.listen = run, listen
        self.image = repository(workload.IMAGE)
        self.good = python_image(sources=(str(REPO),))
        self.images: dict[str, LocalImage] = {self.image: self.good}  # the agents read it: faults swap it
        self.cluster = EmulatedCluster(
            [self._node(n) for n in range(NODES)],
            self.images,
            run / "nodes",
            node_grace_s=NODE_GRACE_S,
        )
        self._numbers = itertools.count(NODES)
        host, port = self.cluster.url.removeprefix("http://").rsplit(":", 1)
        self.link = FaultProxy(host, int(port), name="Kubernetes API link", listen=listen)
        self.api_link = FaultProxy(*api, name="gpuyard API service", listen=listen)
        self.s3 = S3Server()
        self.s3_link = FaultProxy("127.0.0.1", self.s3.port, name="checkpoint store link", listen=listen)
        self.exits: dict[str, dict[int, int]] = {}  # attempt -> node rank -> exit code
        self.ended: dict[str, float] = {}  # attempt -> when its last pod was seen ended (monotonic)
        self._seen: dict[str, str] = {}  # pod uid -> attempt, while it exists
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="pod-exits", daemon=True)

    def _node(self, number: int) -> NodeSpec:
        return NodeSpec(
            f"node-{number}",
            gpus=GPUS_PER_NODE,
            cpu="8",
            memory="32Gi",
            labels={"nvidia.com/gpu.product": "cpu"},
            shared=(str(self.run),),
        )

    def start(self) -> Pods:
        self.cluster.start()
        self.link.start()
        self.api_link.start()
        self.s3.start()
        self.s3.create_bucket(BUCKET)
        self.s3_link.start()
        self._watcher.start()
        return self

    @property
    def store(self) -> str:
        return f"s3://{BUCKET}"

    def store_env(self) -> dict[str, str]:
        """The object store's client settings, through its link (what the team's Secret holds)."""
        return self.s3.env | {"AWS_ENDPOINT_URL": f"http://{self.listen}:{self.s3_link.port}"}

    def env(self) -> dict[str, str]:
        """The control plane's settings for the Kubernetes launcher, the API server and the object
        store each through its link; every worker pod gets the store's Secret."""
        kubeconfig = write_kubeconfig(f"http://{self.listen}:{self.link.port}", self.run / "kubeconfig")
        return self.store_env() | {
            "GPUYARD_LAUNCHER": "kubernetes",
            "GPUYARD_API_URL": f"http://{self.listen}:{self.api_link.port}",  # the workers' way to it
            "GPUYARD_CHECKPOINT_STORE": self.store,
            "GPUYARD_KUBERNETES__IN_CLUSTER": "false",
            "GPUYARD_KUBERNETES__NAMESPACE": NAMESPACE,
            "GPUYARD_KUBERNETES__WATCH_TIMEOUT_S": "30",
            "GPUYARD_KUBERNETES__ENV_FROM_SECRETS": json.dumps([OBJECT_STORE_SECRET]),
            "KUBECONFIG": str(kubeconfig),
        }

    def apply_namespaces(self, env: dict[str, str]) -> None:
        """What a cluster admin applies for the teams (`gpuyard kubernetes namespaces`), and the team's
        object store Secret."""
        made = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", "kubernetes", "namespaces"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        documents = [doc for doc in yaml.safe_load_all(made.stdout) if doc]
        namespaces = [d["metadata"]["name"] for d in documents if d.get("kind") == "Namespace"]
        # the Secret control_plane makes for a team, naming the store's link, not the server
        secrets = [object_store_secret(ns, self.s3) | {"stringData": self.store_env()} for ns in namespaces]
        documents += secrets
        self.cluster.server.emulator.apply(self.cluster.api.api_client, documents)

    # -- how pods ended ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            with contextlib.suppress(Exception):  # the API server is being stopped
                self._record(self.cluster.api.list_pod_for_all_namespaces(_preload_content=False).data)

    def _record(self, body: bytes) -> None:
        now, present = time.monotonic(), set()
        for pod in json.loads(body)["items"]:
            uid, attempt = pod["metadata"]["uid"], _attempt_of(pod)
            if attempt is None:
                continue
            present.add(uid)
            self._seen[uid] = attempt
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                ended = (status.get("state") or {}).get("terminated")
                rank = int(pod["metadata"].get("labels", {}).get(RANK_LABEL, 0))
                if ended is not None and rank not in self.exits.get(attempt, {}):
                    self.exits.setdefault(attempt, {})[rank] = int(ended["exitCode"])
                    self.ended[attempt] = now
        for uid in set(self._seen) - present:  # deleted: whatever it ran has ended by now
            attempt = self._seen.pop(uid)
            self.ended[attempt] = max(self.ended.get(attempt, 0.0), now)

    # -- faults' helpers ----------------------------------------------------------------------------

    def pods_of(self, attempt_id: str) -> list[dict[str, Any]]:
        listed = json.loads(self.cluster.api.list_pod_for_all_namespaces(_preload_content=False).data)
        return [p for p in listed["items"] if _attempt_of(p) == attempt_id]

    def attempts_on(self, node: str) -> set[str]:
        """The attempts with a pod bound to `node`."""
        listed = json.loads(self.cluster.api.list_pod_for_all_namespaces(_preload_content=False).data)
        return {
            str(a) for p in listed["items"] if p["spec"].get("nodeName") == node and (a := _attempt_of(p))
        }

    def live_nodes(self) -> list[str]:
        return sorted(name for name, agent in self.cluster.agents.items() if not agent.lost)

    def replace(self) -> str:
        """A machine joins in place of a lost one."""
        spec = self._node(next(self._numbers))
        self.cluster.add_node(spec)
        return spec.name

    def stop(self) -> None:
        self._stop.set()
        self.link.stop()
        self.api_link.stop()
        self.s3_link.stop()
        self.cluster.stop()
        self.s3.stop()
        self._watcher.join(5)


def _attempt_of(pod: dict[str, Any]) -> str | None:
    for container in pod["spec"].get("containers") or []:
        for variable in container.get("env") or []:
            if variable.get("name") == "GPUYARD_ATTEMPT_ID":
                return str(variable.get("value"))
    return None


# -- the faults of the cluster ---------------------------------------------------------------------


def _pods(target: Target) -> Pods:
    assert target.pods is not None, "a cluster fault on a campaign without a cluster"
    return target.pods


def _running_pod(target: Target, rng: random.Random) -> dict[str, Any] | None:
    """A pod of a running attempt on a node that is there (a lost node's pods stay in the API, Running,
    until the node is removed), if any runs."""
    pods = _pods(target)
    live = set(pods.live_nodes())
    running = running_attempts(target)
    rng.shuffle(running)
    for attempt_id in running:
        found = [
            p
            for p in pods.pods_of(attempt_id)
            if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName") in live
        ]
        if found:
            return rng.choice(found)
    return None


def lose_node(target: Target, rng: random.Random) -> str | None:
    """A node running an attempt's pod is gone: every process of its pods dies, it reports nothing
    more; a new machine joins in its place. A while later the cloud's node controller, told the
    machine no longer exists, deletes its Node, and the pod garbage collector its pods: until then
    they stay in the API, and a worker that never heartbeat cannot be told from one partitioned
    (gpuyard does not replace such an attempt, nor end it on a cancel, before its pods are gone)."""
    pod = _running_pod(target, rng)
    if pod is None or not pod["spec"].get("nodeName"):
        return None
    pods, node = _pods(target), pod["spec"]["nodeName"]
    agent = pods.cluster.agents[node]
    if agent.lost:
        return None
    lost, on_node = time.monotonic(), pods.attempts_on(node)
    for attempt_id in on_node:
        target.kills.setdefault(attempt_id, lost)
    agent.lose()
    joined = pods.replace()
    noticed = rng.uniform(NODE_GRACE_S, 3 * NODE_GRACE_S)
    time.sleep(noticed)
    pods.cluster.api.delete_node(node)
    for attempt_id in on_node:  # what ended there the platform could not know until its Node went
        target.unheard.setdefault(attempt_id, []).append((lost, time.monotonic()))
    running = pod["metadata"]["name"]
    return f"{node} lost (running {running}); {joined} joined; its Node deleted after {noticed:.1f}s"


def partition_node(target: Target, rng: random.Random) -> str | None:
    """A node stops reporting to the API server for a while, shorter than the lifecycle's grace: its
    pods run on (and heartbeat to gpuyard), what ended meanwhile is reported on healing."""
    return _unreported(target, rng, (1.0, NODE_GRACE_S * 0.8), "partitioned from the API server")


def node_not_ready(target: Target, rng: random.Random) -> str | None:
    """As a partition, past the lifecycle's grace: the node is NotReady (out of the fleet), then back."""
    return _unreported(target, rng, (NODE_GRACE_S * 1.2, NODE_GRACE_S * 2.5), "NotReady")


def isolate_node(target: Target, rng: random.Random) -> str | None:
    """Partition (b): a node and its pods cut from every network (the API server, gpuyard, the object
    store, its gang's other nodes) for a while, from under a lease to past the lifecycle's grace: its
    workers run on, unheard, and stop writing once a lease passed without an answered beat."""
    return _unreported(target, rng, (1.0, NODE_GRACE_S * 2.5), "cut from every network", pods_too=True)


def _unreported(
    target: Target, rng: random.Random, seconds: tuple[float, float], what: str, *, pods_too: bool = False
) -> str | None:
    pod = _running_pod(target, rng)
    if pod is None or not pod["spec"].get("nodeName"):
        return None
    pods, node = _pods(target), pod["spec"]["nodeName"]
    agent = pods.cluster.agents[node]
    duration = rng.uniform(*seconds)
    on_node = pods.attempts_on(node)
    began = time.monotonic()
    agent.partition(pods_too=pods_too)
    try:
        time.sleep(duration)
    finally:
        agent.heal()
        for attempt_id in on_node:
            target.unheard.setdefault(attempt_id, []).append((began, time.monotonic()))
    return f"{agent.node.name} (running {pod['metadata']['name']}) {what} for {duration:.1f}s"


def evict_pod(target: Target, rng: random.Random) -> str | None:
    pod = _running_pod(target, rng)
    if pod is None:
        return None
    meta = pod["metadata"]
    target.disruptions.setdefault(_attempt_of(pod) or "", time.monotonic())
    _pods(target).cluster.evict(meta["name"], meta["namespace"])
    return f"{meta['name']} evicted"


def delete_pod(target: Target, rng: random.Random) -> str | None:
    """Someone deletes an attempt's pod (kubectl delete), with its grace period or none."""
    pod = _running_pod(target, rng)
    if pod is None:
        return None
    meta, grace = pod["metadata"], rng.choice([None, 0])
    target.disruptions.setdefault(_attempt_of(pod) or "", time.monotonic())
    api = _pods(target).cluster.api
    api.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=grace)
    return f"{meta['name']} deleted ({'no grace' if grace == 0 else 'its grace period'})"


def _image_for_a_while(target: Target, image: LocalImage, seconds: float) -> None:
    pods = _pods(target)
    pods.images[pods.image] = image
    try:
        time.sleep(seconds)
    finally:
        pods.images[pods.image] = pods.good


def slow_pull(target: Target, rng: random.Random) -> str:
    """The registry is slow for a while: every pod started meanwhile pulls for seconds."""
    pull_s, seconds = rng.uniform(3, 15), rng.uniform(5, 20)
    pods = _pods(target)
    _image_for_a_while(target, python_image(sources=(str(REPO),), pull_s=pull_s), seconds)
    return f"pulls of {pods.image} take {pull_s:.1f}s for {seconds:.1f}s"


def failing_pull(target: Target, rng: random.Random) -> str:
    """The registry refuses pulls for a while (ErrImagePull, then ImagePullBackOff)."""
    seconds = rng.uniform(3, 15)
    _image_for_a_while(target, LocalImage(pull_error="unauthorized: authentication required"), seconds)
    return f"pulls of {_pods(target).image} refused for {seconds:.1f}s"


def _kubernetes(target: Target) -> FaultProxy:
    return _pods(target).link


def _store(target: Target) -> FaultProxy:
    return _pods(target).s3_link


CLUSTER_FAULTS: dict[str, Fault] = {
    "lose-node": lose_node,
    "partition-node": partition_node,
    "node-not-ready": node_not_ready,
    "isolate-node": isolate_node,
    "evict-pod": evict_pod,
    "delete-pod": delete_pod,
    "slow-pull": slow_pull,
    "failing-pull": failing_pull,
    "cut-kubernetes-api": degrade(_kubernetes, "cut", (1, 8)),
    "blackhole-kubernetes-api": degrade(_kubernetes, "blackhole", (2, 12)),
    # the checkpoint store slow, or refusing every request (its disk's faults where it is one)
    "delay-checkpoint-store": degrade(_store, "delay", (3, 8)),
    "cut-checkpoint-store": degrade(_store, "cut", (1, 6)),
}
# What strikes a campaign on the cluster: the control plane's faults (but the checkpoint disk's: the
# store is an object store here) and the cluster's.
KUBERNETES_FAULTS: dict[str, Fault] = {k: f for k, f in FAULTS.items() if k != "full-disk"} | CLUSTER_FAULTS
