"""A node of the emulated cluster: it registers its Node, reports it Ready, and runs the pods bound to
it as local processes, as a kubelet does.

Each pass (level-triggered, every `every_s`): the node's heartbeat (every `report_every_s`); then
for every pod bound to this node (kmock ignores field selectors: the agent filters itself):
- a new one: its finalizer (held until its containers have stopped, so a delete waits for them),
  its image pulled (`images.py`: the pull's time, or its failure as `ErrImagePull`), its environment
  resolved (values, Secret keys by reference, `envFrom` Secrets; a missing one is
  `CreateContainerConfigError`), its `emptyDir` volumes made, and its one container started
  (`container.py`: in a mount namespace of its own, each volume at its mount path, as the pod's
  user); the pod Running;
- a running one whose process ended: Succeeded (exit 0) or Failed, the container `terminated` with
  its exit code (128 + the signal for one killed by a signal, as a runtime reports it);
- a deleted one (deletionTimestamp): SIGTERM to the container's process group, SIGKILL once the
  grace period has passed, and the finalizer removed when it has stopped.

Given the cluster's `PodNetwork`, each pod runs in a network namespace of its own on the cluster's
bridge (its `podIP`), with the cluster's names as its `/etc/hosts` and a resolver that fails every
other name at once (`network.py`). What is not
emulated yet: cgroup limits (CPU and memory are placed, not enforced;
GPUs are counted only), more than one container per pod, probes, restart policies other than Never.

Faults a test sets: `partition()` (the node stops reporting: no heartbeat, no pod status, its pods
run on and reach everything), `partition(pods_too=True)` (the machine cut from every network: its
pods run on and reach nothing, not even each other's gang), `heal()`, `lose()` (the node is gone:
its pods' processes die with it, nothing more is reported).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity
from local_cluster.images import LocalImage, repository
from local_cluster.network import Attachment, PodNetwork
from local_cluster.periodic import Periodic

log = logging.getLogger(__name__)

FINALIZER = "local-cluster.gpuyard.io/containers"  # the agent's hold on a deleted pod
# The labels NVIDIA's GPU feature discovery puts on a node of H100s (80 GB), which a GPU scheduler reads
# the node's GPU model and memory from: a NodeSpec's `labels` for an emulated H100 node.
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
Obj = dict[str, Any]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A pass lists every pod of the cluster (kmock ignores field selectors). An idle cluster of four nodes
# cost 19% of a core on the 2-core machine with the agents' and the binder's passes every 0.1 s (and
# the node controller's every 0.2 s), 9% with these; a kubelet relists its containers every second.
PASS_EVERY_S = 0.25


@dataclass(frozen=True)
class NodeSpec:
    """An emulated node: what it advertises (allocatable), its labels and its taints."""

    name: str
    gpus: int = 2
    cpu: str = "8"
    memory: str = "16Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    # Folders of this machine every pod on the node sees read-write at their own paths, above its
    # volumes: a filesystem every node mounts (NFS, a parallel file system), where training data lives.
    shared: tuple[str, ...] = ()

    def manifest(self) -> Obj:
        allocatable = {
            "cpu": self.cpu,
            "memory": self.memory,
            "nvidia.com/gpu": str(self.gpus),
            "pods": "110",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name, **self.labels}},
            "spec": {"taints": [dict(t) for t in self.taints]},
            "status": {"allocatable": allocatable, "capacity": allocatable, "conditions": [_ready(True)]},
        }


def _ready(ready: bool) -> Obj:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "lastHeartbeatTime": _now(),
    }


@dataclass
class _Pod:
    """What the agent knows of one pod it runs."""

    name: str
    namespace: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    pull_until: float | None = None  # monotonic: when its image's pull is over
    ended: bool = False
    kill_at: float | None = None  # monotonic: SIGKILL then (its grace period started)
    waiting: str | None = None  # the waiting reason last reported
    attachment: Attachment | None = None  # its network namespace on the cluster's bridge
    cgroups: list[str] = field(default_factory=list)  # its memory and cpu cgroups (cgroup v1)


class NodeAgent:
    def __init__(
        self,
        api: k8s.CoreV1Api,
        node: NodeSpec,
        images: Mapping[str, LocalImage],
        root: Path,
        *,
        every_s: float = PASS_EVERY_S,
        report_every_s: float = 1.0,
        network: PodNetwork | None = None,
    ):
        """`network`: pods in network namespaces of their own on the cluster's bridge; without it they
        share this machine's network (and its loopback)."""
        self.api, self.node, self.images, self.root, self.network = api, node, images, root, network
        self.report_every_s = report_every_s
        self.reporting = True  # False: partitioned from the API (pods run on)
        self.lost = False
        self._pods: dict[str, _Pod] = {}  # pod uid -> its state here
        self._cut: list[Attachment] = []  # its pods' namespaces a partition cut off
        self._reported = 0.0
        self._loop = Periodic(f"agent-{node.name}", every_s, self.step)
        self._passing = threading.Lock()

    # -- the node ----------------------------------------------------------------------------------

    def register(self) -> NodeAgent:
        self.api.create_node(self.node.manifest())
        self._reported = time.monotonic()
        return self

    def _heartbeat(self) -> None:
        if time.monotonic() - self._reported >= self.report_every_s:
            self.api.patch_node_status(
                self.node.name, {"status": {"conditions": [_ready(True)]}}, _preload_content=False
            )
            self._reported = time.monotonic()

    # -- one pass ----------------------------------------------------------------------------------

    def step(self) -> None:
        with self._passing:  # a fault a test sets lands between passes, never inside one
            self._step()

    def _step(self) -> None:
        if self.lost or not self.reporting:  # partitioned: what ended meanwhile is reported on healing
            return
        self._heartbeat()
        listed = json.loads(self.api.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        mine = {p["metadata"]["uid"]: p for p in listed if p["spec"].get("nodeName") == self.node.name}
        for uid, known in list(self._pods.items()):
            if uid not in mine:  # deleted without waiting for us (no finalizer yet): stop it now
                self._kill(known, signal.SIGKILL)
                self._forget(uid)
        for uid, pod in mine.items():
            try:
                self._sync(uid, pod)
            except ApiException as error:
                if error.status != 404:  # gone meanwhile: the next pass sees it so
                    raise

    def _sync(self, uid: str, pod: Obj) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        known = self._pods.get(uid)
        if known is None:
            if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
                return
            known = self._admit(uid, pod)
        if meta.get("deletionTimestamp"):
            self._terminate(uid, known, pod)
        elif known.process is None and not known.ended:
            self._start(known, pod)
        elif (
            known.process is not None
            and known.process.poll() is not None
            and status.get("phase") == "Running"
        ):
            self._report_exit(known, pod)

    def _admit(self, uid: str, pod: Obj) -> _Pod:
        meta = pod["metadata"]
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        self.api.patch_namespaced_pod(
            meta["name"], meta["namespace"], {"metadata": {"finalizers": finalizers}}, _preload_content=False
        )
        known = _Pod(
            meta["name"], meta["namespace"], self.root / meta["namespace"] / f"{meta['name']}-{uid[:8]}"
        )
        image = self.images.get(repository(pod["spec"]["containers"][0]["image"]))
        if image is not None and image.pull_s:
            known.pull_until = time.monotonic() + image.pull_s
        self._pods[uid] = known
        return known

    def _start(self, known: _Pod, pod: Obj) -> None:
        container = pod["spec"]["containers"][0]
        image = self.images.get(repository(container["image"]))
        if image is None or image.pull_error:
            why = image.pull_error if image else f"{container['image']}: manifest unknown"
            self._waiting(pod, "ErrImagePull", f"failed to pull image {container['image']!r}: {why}")
            known.ended = True
            return
        if known.pull_until is not None and time.monotonic() < known.pull_until:
            if known.waiting != "ContainerCreating":
                self._waiting(pod, "ContainerCreating", f"pulling image {container['image']!r}")
                known.waiting = "ContainerCreating"
            return
        try:
            env = {**image.env, **self._environment(pod, container)}
        except LookupError as error:
            self._waiting(pod, "CreateContainerConfigError", str(error))
            known.ended = True
            return
        # The volumes, then the node's shared folders and the image's files over them: one below a
        # volume's path (a checkout below /tmp, say) stays visible.
        shared = {folder: folder for folder in self.node.shared}
        mounts = {**self._volumes(known, pod, container), **shared, **image.files}
        known.cgroups = _cgroups(known, container)
        address = "127.0.0.1"
        if self.network is not None:
            known.attachment = self.network.bridge.attach()
            address = known.attachment.address
            meta, names = pod["metadata"], (pod["spec"].get("hostname") or pod["metadata"]["name"])
            self.network.names.add(
                meta["uid"], address, names, pod["spec"].get("subdomain"), meta["namespace"]
            )
            mounts["/etc/hosts"] = str(self.network.names.path)
            mounts["/etc/resolv.conf"] = str(self.network.names.resolver)
        security = {**(pod["spec"].get("securityContext") or {}), **(container.get("securityContext") or {})}
        spec = {
            "argv": [*(container.get("command") or []), *(container.get("args") or [])],
            "env": env,
            "mounts": mounts,
            "workdir": container.get("workingDir") or image.workdir,
            "user": security.get("runAsUser"),
            "group": security.get("runAsGroup"),
            "hostname": pod["spec"].get("hostname") or pod["metadata"]["name"],
            "readonly": sorted(image.files),
            "cgroups": known.cgroups,
        }
        (known.directory / "container.json").write_text(json.dumps(spec))
        with (known.directory / "log").open("ab") as out:
            runtime = [
                *("unshare", "--mount", "--uts", "--propagation", "private", "--"),
                *(
                    sys.executable,
                    "-I",
                    "-m",
                    "local_cluster.container",
                    str(known.directory / "container.json"),
                ),
            ]
            if known.attachment is not None and self.network is not None:
                runtime = self.network.bridge.argv(known.attachment, runtime)
            known.process = subprocess.Popen(
                runtime,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its process group: SIGTERM and SIGKILL reach all of it
                cwd="/",
                env={"PATH": os.environ.get("PATH", "")},  # the runtime's own: never the pod's
            )
        started = _now()
        self._status(
            pod,
            {
                "phase": "Running",
                "startTime": started,
                "hostIP": self.network.bridge.gateway if self.network else "127.0.0.1",
                "podIP": address,
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
                "containerStatuses": [_container(container, {"running": {"startedAt": started}})],
            },
        )

    def _environment(self, pod: Obj, container: Obj) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                env.update(self._secret(namespace, source["secretRef"]["name"]))
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                values = self._secret(namespace, ref["name"])
                if ref["key"] not in values:
                    raise LookupError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
                env[item["name"]] = values[ref["key"]]
        return env

    def _secret(self, namespace: str, name: str) -> dict[str, str]:
        try:
            secret = json.loads(self.api.read_namespaced_secret(name, namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status == 404:
                raise LookupError(f'secret "{name}" not found') from None
            raise
        values = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        return {**values, **(secret.get("stringData") or {})}

    def _volumes(self, known: _Pod, pod: Obj, container: Obj) -> dict[str, str]:
        """Each emptyDir a directory of the pod's own, owned by the pod's user (fsGroup's role)."""
        security = pod["spec"].get("securityContext") or {}
        owner = security.get("runAsUser"), security.get("fsGroup") or security.get("runAsGroup")
        by_name = {}
        for volume in pod["spec"].get("volumes") or []:
            if "emptyDir" in volume:
                path = known.directory / "volumes" / volume["name"]
                path.mkdir(parents=True, exist_ok=True)
                if owner[0] is not None:
                    os.chown(path, owner[0], owner[1] if owner[1] is not None else -1)
                by_name[volume["name"]] = str(path)
        known.directory.mkdir(parents=True, exist_ok=True)
        return {
            m["mountPath"]: by_name[m["name"]]
            for m in container.get("volumeMounts") or []
            if m["name"] in by_name
        }

    def _report_exit(self, known: _Pod, pod: Obj) -> None:
        assert known.process is not None
        code = known.process.returncode
        self._kill(known, signal.SIGKILL)  # a container ends with its main process: what it left too
        exit_code = 128 - code if code < 0 else code
        terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "finishedAt": _now(),
            **({"signal": -code} if code < 0 else {}),
        }
        container = pod["spec"]["containers"][0]
        self._status(
            pod,
            {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "False"},
                ],
                "containerStatuses": [_container(container, {"terminated": terminated})],
            },
        )
        known.ended = True

    def _terminate(self, uid: str, known: _Pod, pod: Obj) -> None:
        """A deleted pod: its containers asked to stop, killed after the grace period, then let go."""
        running = known.process is not None and known.process.poll() is None
        if running and known.kill_at is None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            known.kill_at = time.monotonic() + float(grace)
            self._kill(known, signal.SIGTERM)
        elif running and known.kill_at is not None and time.monotonic() >= known.kill_at:
            self._kill(known, signal.SIGKILL)
        if running:
            return
        if known.process is not None and pod.get("status", {}).get("phase") == "Running":
            self._report_exit(known, pod)
        finalizers = [f for f in pod["metadata"].get("finalizers") or [] if f != FINALIZER]
        meta = pod["metadata"]
        self.api.patch_namespaced_pod(
            meta["name"],
            meta["namespace"],
            {"metadata": {"finalizers": finalizers or None}},
            _preload_content=False,
        )
        self._forget(uid)

    def _kill(self, known: _Pod, sig: int) -> None:
        """SIGTERM to the container's main process, as a runtime sends it (its PID 1 passes it on);
        SIGKILL to every process of the container: its cgroup's, else its process group's."""
        if known.process is None:
            return
        if sig != signal.SIGKILL:
            if known.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(known.process.pid, sig)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(known.process.pid, signal.SIGKILL)
        for _ in range(100):  # what forks while it is being killed is killed on the next round
            members = [int(pid) for group in known.cgroups[:1] for pid in _procs(group)]
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def _forget(self, uid: str) -> None:
        known = self._pods.pop(uid)
        if known.process is not None:
            known.process.wait()
        if self.network is not None and known.attachment is not None:
            self.network.names.remove(uid)
            self.network.bridge.detach(known.attachment)
        for group in known.cgroups:
            with contextlib.suppress(OSError):  # empty once its processes are gone
                Path(group).rmdir()
        log_file = known.directory / "log"
        if log_file.exists():  # kept after the pod, as a node keeps a container's logs for a while
            kept = self.root / "logs" / f"{known.namespace}_{known.directory.name}.log"
            kept.parent.mkdir(parents=True, exist_ok=True)
            log_file.rename(kept)
        shutil.rmtree(known.directory, ignore_errors=True)

    def _waiting(self, pod: Obj, reason: str, message: str) -> None:
        container = pod["spec"]["containers"][0]
        waiting = {"waiting": {"reason": reason, "message": message}}
        self._status(pod, {"phase": "Pending", "containerStatuses": [_container(container, waiting)]})

    def _status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        if "conditions" in status:  # a kubelet sets its own conditions and keeps others' (DisruptionTarget)
            own = {condition["type"] for condition in status["conditions"]}
            others = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] not in own]
            status = {**status, "conditions": [*status["conditions"], *others]}
        self.api.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": status}, _preload_content=False
        )
        pod["status"] = {**(pod.get("status") or {}), **status}

    # -- running and faults ------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        self._loop.start()
        return self

    def partition(self, *, pods_too: bool = False) -> None:
        """The node stops reporting; its pods run on. `pods_too`: every packet to and from its pods
        is dropped as well (without a pod network they share the machine's: only the node is cut)."""
        with self._passing:
            self.reporting = False
            if pods_too and self.network is not None:
                self._cut = [known.attachment for known in self._pods.values() if known.attachment]
                for attachment in self._cut:
                    self.network.bridge.cut(attachment)

    def heal(self) -> None:
        with self._passing:
            self.reporting = True
            for attachment in self._cut:
                assert self.network is not None
                self.network.bridge.heal(attachment)
            self._cut = []

    def lose(self) -> None:
        """The node is gone: every process of its pods dies with it, and it reports nothing more."""
        with self._passing:
            self.lost = True
        for known in self._pods.values():
            self._kill(known, signal.SIGKILL)
            if known.process is not None:
                known.process.wait()

    def stop(self) -> None:
        """Stop the agent and every container it runs (SIGKILL): what a test leaves behind."""
        self._loop.stop()
        for uid in list(self._pods):
            self._kill(self._pods[uid], signal.SIGKILL)
            self._forget(uid)


CGROUPS = Path("/sys/fs/cgroup")  # cgroup v1: one hierarchy per controller


def _cgroups(known: _Pod, container: Obj) -> list[str]:
    """The container's memory and cpu cgroups, with its limits (`memory`: bytes; `cpu`: a CFS quota
    of that many cores), where cgroup v1 is mounted and writable; none elsewhere."""
    limits = (container.get("resources") or {}).get("limits") or {}
    made = []
    for controller in ("memory", "cpu"):
        path = CGROUPS / controller / "local-cluster" / f"{known.namespace}-{known.directory.name}"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return []
        made.append(str(path))
        if controller == "memory" and "memory" in limits:
            (path / "memory.limit_in_bytes").write_text(str(int(parse_quantity(limits["memory"]))))
        if controller == "cpu" and "cpu" in limits:
            (path / "cpu.cfs_quota_us").write_text(str(int(parse_quantity(limits["cpu"]) * 100_000)))
    return made


def _procs(group: str) -> list[str]:
    try:
        return (Path(group) / "cgroup.procs").read_text().split()
    except OSError:
        return []


def _container(container: Obj, state: Obj) -> Obj:
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": f"local://{repository(container['image'])}",  # the clients require one
        "ready": "running" in state,
        "restartCount": 0,
        "state": state,
    }
