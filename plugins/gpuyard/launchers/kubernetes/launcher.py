"""KubernetesLauncher: attempts become pods on the chosen nodes; pod watches become WorkerReports.

Level-triggered like a controller. `launch` creates the attempt's Secret (the owner), its headless
Service and one pod per node rank; a 409 Conflict means an earlier launch (maybe before a restart)
got there first, and the existing object is adopted. Two background threads watch pods and nodes
(list, then watch from the list's resourceVersion; 410 Gone re-lists) and feed a queue; `observe`
drains it into a cache of pods and nodes and decides each attempt's fate from ALL its pods (fates.py).
Once the store has an attempt's ending (`acknowledge`), all its objects are deleted: nothing outlives
its attempt (its logs outlive it in the cluster's log collection, not in its pods).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as kubeconfig
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpuyard.clock import Clock, utcnow
from gpuyard.launchers.base import LaunchRequest, Outcome, WorkerReport
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.launchers.kubernetes.config import KubernetesConfig
from gpuyard.launchers.kubernetes.fates import PodFate, attempt_fate, gone_fate, pod_fate

log = logging.getLogger(__name__)

GONE_WHY = "pod deleted before it ended: its node was removed, or it was deleted outside gpuyard"


class LaunchError(RuntimeError):
    """The API refused to create an attempt's objects (other than the 409 that means: already there)."""


def load_api(config: KubernetesConfig) -> k8s.CoreV1Api:
    """The API client for this process: its pod's service account in a cluster, else ~/.kube/config."""
    if config.in_cluster:
        kubeconfig.load_incluster_config()
    else:  # read $KUBECONFIG now: the client reads it once, when first imported
        kubeconfig.load_kube_config(config_file=config.kubeconfig or os.environ.get("KUBECONFIG"))
    return k8s.CoreV1Api()


@dataclass
class _Attempt:
    attempt_id: str
    key: str
    gang_size: int
    nodes: dict[int, str]
    token: int
    seen: set[int] = field(default_factory=set)
    running: bool = False  # every pod runs on a Ready node, as last observed
    running_acknowledged: bool = False
    ending: WorkerReport | None = None  # repeated by observe() until acknowledged
    cancelled: bool = False


@dataclass(frozen=True)
class _Event:
    kind: str  # "pod" or "node"
    type: str  # ADDED, MODIFIED, DELETED, or SYNC (a full listing in `items`)
    obj: dict[str, Any] = field(default_factory=dict)
    items: tuple[dict[str, Any], ...] = ()


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _rank(pod: Mapping[str, Any]) -> int | None:
    value = (_meta(pod).get("labels") or {}).get(m.RANK_LABEL)
    return int(value) if value is not None and value.isdigit() else None


def _pod_node(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or (_meta(pod).get("annotations") or {}).get(
        m.NODE_ANNOTATION
    )


def _attempt_id(obj: Mapping[str, Any]) -> str | None:
    return (_meta(obj).get("annotations") or {}).get(m.ATTEMPT_ID_ANNOTATION)


def _ready(node: Mapping[str, Any]) -> bool:
    """The kubelet reports the node Ready (a NotReady node's pods may be running or gone: unknown)."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ours(obj: Mapping[str, Any]) -> bool:
    """Checked on our side too, so a list that ignored the label selector cannot hand us strangers."""
    return (_meta(obj).get("labels") or {}).get(m.MANAGED_BY) == "gpuyard" and _attempt_id(obj) is not None


class KubernetesLauncher:
    def __init__(
        self,
        config: KubernetesConfig,
        api: k8s.CoreV1Api | None = None,
        *,
        clock: Clock = utcnow,
        backoff_s: float = 0.5,
    ):
        self.config = config
        self.api = api if api is not None else load_api(config)
        self._clock = clock
        self._backoff_s = backoff_s
        self._ns = config.namespace
        self._timeout = config.request_timeout_s
        self._lock = threading.RLock()
        self._events: queue.Queue[_Event] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: set[watch.Watch] = set()
        self._attempts: dict[str, _Attempt] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # pod name -> last seen object
        self._deleted: dict[str, dict[str, Any]] = {}  # pod name -> its last object when it was deleted
        self._nodes: dict[str, bool] | None = None  # node name -> Ready; None until the first listing
        self._ended: dict[str, int] = {}  # attempt key -> gang size: objects to delete (store has the end)
        self.relists = 0  # listings after the first, e.g. after 410 Gone (for metrics and tests)

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the pod and node watches (idempotent; launch, observe and reconcile call it)."""
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            pods = (
                "pod",
                self.api.list_namespaced_pod,
                {"namespace": self._ns, "label_selector": m.SELECTOR},
            )
            nodes = ("node", self.api.list_node, {})
            for kind, list_fn, kwargs in (pods, nodes):
                thread = threading.Thread(
                    target=self._watch_loop,
                    args=(kind, list_fn, kwargs),
                    name=f"gpuyard-watch-{kind}",
                    daemon=True,
                )
                thread.start()
                self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def __enter__(self) -> KubernetesLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch_loop(self, kind: str, list_fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        """List, then watch from the list's resourceVersion; resume after a timeout, re-list after 410."""
        version: str | None = None
        listed = False
        delay = self._backoff_s
        while not self._stop.is_set():
            try:
                if version is None:
                    response = list_fn(**kwargs, _preload_content=False, _request_timeout=self._timeout)
                    body = json.loads(response.data)
                    version = _meta(body).get("resourceVersion") or ""
                    items = tuple(item for item in body.get("items") or () if kind == "node" or _ours(item))
                    self._events.put(_Event(kind, "SYNC", items=items))
                    if listed:
                        self.relists += 1
                    listed = True
                w = watch.Watch(return_type="object")  # raw dicts: no client-side model validation
                self._watches.add(w)
                started, events = time.monotonic(), 0
                try:
                    for event in w.stream(
                        list_fn,
                        **kwargs,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=self.config.watch_timeout_s,
                        _request_timeout=(self._timeout, self.config.watch_timeout_s + self._timeout),
                    ):
                        if self._stop.is_set():
                            break
                        raw = event["raw_object"]
                        version = _meta(raw).get("resourceVersion") or version
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED") and (
                            kind == "node" or _ours(raw)
                        ):
                            self._events.put(_Event(kind, event["type"], raw))
                finally:
                    self._watches.discard(w)
                if not events and time.monotonic() - started < 1.0:  # ended at once: do not spin
                    self._stop.wait(delay)
                    delay = min(delay * 2, 30.0)
                else:
                    delay = self._backoff_s
            except ApiException as error:
                if error.status == 410:
                    log.info("%s watch expired (410 Gone): re-listing", kind)
                    version = None
                    continue
                log.warning("%s watch: API error %s %s; retrying", kind, error.status, error.reason)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
            except Exception as error:  # connection reset, read timeout, server restart
                if self._stop.is_set():
                    break
                log.warning("%s watch: %s; retrying", kind, error)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)

    # ----------------------------------------------------------------------------- launch

    def _create(
        self, kind: str, body: dict[str, Any], create: Callable[..., Any], read: Callable[..., Any]
    ) -> Any:
        """Create, or adopt what a previous launch of the same attempt created (409 Conflict)."""
        name = body["metadata"]["name"]
        try:
            response = create(self._ns, body, _preload_content=False, _request_timeout=self._timeout)
            return json.loads(response.data)
        except ApiException as error:
            if error.status != 409:
                raise LaunchError(
                    f"creating {kind} {self._ns}/{name}: {error.status} {error.reason}"
                ) from error
        response = read(name, self._ns, _preload_content=False, _request_timeout=self._timeout)
        existing = json.loads(response.data)
        wanted, found = _attempt_id(body), _attempt_id(existing)
        if found != wanted:
            raise LaunchError(
                f"{kind} {self._ns}/{name} exists but belongs to attempt {found!r}, not {wanted!r}"
            )
        log.info(
            "adopted existing %s %s/%s of attempt %s",
            kind,
            self._ns,
            name,
            wanted,
            extra={"attempt_id": wanted},
        )
        return existing

    def launch(self, request: LaunchRequest) -> None:
        self.start()
        key = m.attempt_key(request.attempt_id)
        with self._lock:
            self._attempts.setdefault(
                request.attempt_id,
                _Attempt(
                    attempt_id=request.attempt_id,
                    key=key,
                    gang_size=len(request.placement.slices),
                    nodes={rank: s.node for rank, s in enumerate(request.placement.slices)},
                    token=request.fencing_token,
                ),
            )
        api = self.api
        owner = self._create(
            "secret",
            m.build_secret(request, self.config),
            api.create_namespaced_secret,
            api.read_namespaced_secret,
        )
        objects = m.build_attempt(request, self.config, owner)
        self._create("service", objects.service, api.create_namespaced_service, api.read_namespaced_service)
        for pod in objects.pods:
            self._create("pod", pod, api.create_namespaced_pod, api.read_namespaced_pod)

    # ----------------------------------------------------------------------------- cancel and cleanup

    def _delete(self, delete: Callable[..., Any], name: str, **kwargs: Any) -> None:
        try:
            delete(name, self._ns, _request_timeout=self._timeout, **kwargs)
        except ApiException as error:
            if error.status != 404:
                raise

    def _delete_pods(self, names: list[str], grace_s: float) -> None:
        for name in names:
            self._delete(self.api.delete_namespaced_pod, name, grace_period_seconds=max(int(grace_s), 0))

    def _delete_attempt_objects(self, key: str, pod_names: list[str], grace_s: float) -> None:
        """Pods with the grace period, then the Service, then the owner Secret (the garbage collector
        would remove the dependents too; deleting them here does not wait for it)."""
        self._delete_pods(pod_names, grace_s)
        self._delete(self.api.delete_namespaced_service, key)
        self._delete(self.api.delete_namespaced_secret, key, propagation_policy="Background")

    def _list(self, list_fn: Callable[..., Any]) -> list[dict[str, Any]]:
        response = list_fn(
            self._ns, label_selector=m.SELECTOR, _preload_content=False, _request_timeout=self._timeout
        )
        return [item for item in json.loads(response.data).get("items") or () if _ours(item)]

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        """SIGTERM now (pod deletion), SIGKILL by the kubelet after `grace_s`; the attempt's objects go."""
        key = m.attempt_key(attempt_id)
        with self._lock:
            attempt = self._attempts.get(attempt_id)
            if attempt is not None:
                attempt.cancelled = True
        names = [
            _meta(pod)["name"]
            for pod in self._list(self.api.list_namespaced_pod)
            if _attempt_id(pod) == attempt_id
        ]
        self._delete_attempt_objects(key, names, grace_s)

    # ----------------------------------------------------------------------------- observe

    def _apply(self, event: _Event) -> None:
        if event.kind == "node":
            if event.type == "SYNC":
                self._nodes = {_meta(node).get("name", ""): _ready(node) for node in event.items}
            elif self._nodes is not None:
                name = _meta(event.obj).get("name", "")
                if event.type == "DELETED":
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = _ready(event.obj)
            return
        if event.type == "SYNC":
            listed = {_meta(pod)["name"]: dict(pod) for pod in event.items}
            for name in set(self._pods) - set(listed):  # vanished while nobody watched
                self._deleted[name] = self._pods[name]
            self._pods = listed
            return
        name = _meta(event.obj).get("name", "")
        if event.type == "DELETED":
            self._pods.pop(name, None)
            self._deleted[name] = event.obj
        else:
            self._pods[name] = event.obj
            self._deleted.pop(name, None)

    def _rank_fate(self, attempt: _Attempt, rank: int) -> PodFate | None:
        name = m.pod_name(attempt.key, rank)
        pod = self._pods.get(name)
        if pod is not None:
            attempt.seen.add(rank)
            fate = pod_fate(pod, m.WORKER_CONTAINER)
            node = _pod_node(pod) or attempt.nodes.get(rank)
            if not fate.ended and self._nodes is not None and node is not None and node not in self._nodes:
                return PodFate(Outcome.LOST, f"node {node} was removed from the cluster")
            return fate
        if rank in attempt.seen:
            last = self._deleted.get(name)
            last_fate = pod_fate(last, m.WORKER_CONTAINER) if last is not None else None
            return gone_fate(last_fate, cancelled=attempt.cancelled, why=GONE_WHY)
        return None

    def _on_ready_nodes(self, attempt: _Attempt) -> bool:
        if self._nodes is None:
            return False
        for rank in range(attempt.gang_size):
            pod = self._pods.get(m.pod_name(attempt.key, rank))
            node = (_pod_node(pod) if pod is not None else None) or attempt.nodes.get(rank)
            if node is None or not self._nodes.get(node, False):
                return False
        return True

    def observe(self) -> list[WorkerReport]:
        self.start()
        reports: list[WorkerReport] = []
        teardown: list[str] = []
        with self._lock:
            while True:
                try:
                    self._apply(self._events.get_nowait())
                except queue.Empty:
                    break
            for attempt in self._attempts.values():
                if attempt.ending is None:
                    fates = {
                        rank: fate
                        for rank in range(attempt.gang_size)
                        if (fate := self._rank_fate(attempt, rank)) is not None
                    }
                    fate = attempt_fate(fates, attempt.gang_size)
                    attempt.running = fate.outcome is Outcome.RUNNING and self._on_ready_nodes(attempt)
                    if fate.ended:
                        assert fate.outcome is not None
                        attempt.ending = WorkerReport(
                            attempt.attempt_id,
                            fate.outcome,
                            self._clock(),
                            fate.exit_code,
                            fate.reason,
                            disrupted=fate.disrupted or attempt.cancelled,
                        )
                        # The gang ended: stop every rank that has not (seen by the watch or not).
                        teardown += [
                            m.pod_name(attempt.key, rank)
                            for rank in range(attempt.gang_size)
                            if rank not in fates or not fates[rank].ended
                        ]
                if attempt.ending is not None:
                    reports.append(attempt.ending)
                elif attempt.running and not attempt.running_acknowledged:
                    reports.append(WorkerReport(attempt.attempt_id, Outcome.RUNNING, self._clock()))
        self._delete_pods(teardown, self.config.termination_grace_s)
        self._clean_up()
        return reports

    def acknowledge(self, report: WorkerReport) -> None:
        """The store has the report. An ending is final there, so the attempt's objects go now."""
        with self._lock:
            attempt = self._attempts.get(report.attempt_id)
            if attempt is None:
                return
            if report.outcome is Outcome.RUNNING:
                attempt.running_acknowledged = True
                return
            del self._attempts[report.attempt_id]
            self._ended[attempt.key] = attempt.gang_size
        self._clean_up()

    def _clean_up(self) -> None:
        """Delete the pods, Service and Secret of every attempt whose ending the store has. A pod being
        stopped keeps its grace period (an equal one does not shorten it); an API error leaves the
        attempt for the next observe, and a restarted launcher's reconcile deletes what is not live."""
        with self._lock:
            ended = dict(self._ended)
        for key, gang_size in ended.items():
            names = [m.pod_name(key, rank) for rank in range(gang_size)]
            try:
                self._delete_attempt_objects(key, names, self.config.termination_grace_s)
            except Exception as error:  # API errors, connection resets: retried next pass
                log.warning("cleaning up attempt objects %s/%s: %s; retrying", self._ns, key, error)
                continue
            with self._lock:
                self._ended.pop(key, None)

    def alive(self) -> dict[str, int]:
        """Attempts whose every pod runs (worker container not terminated) on a Ready node."""
        with self._lock:
            return {a.attempt_id: a.token for a in self._attempts.values() if a.running and a.ending is None}

    def release(self, attempt_id: str) -> bool:
        """Delete the attempt's objects at once; True when none of its pods remains on a Ready node
        (a pod on a NotReady or removed node is taken as dead with its node)."""
        self.cancel(attempt_id, grace_s=0)
        pods = [pod for pod in self._list(self.api.list_namespaced_pod) if _attempt_id(pod) == attempt_id]
        with self._lock:
            nodes = self._nodes or {}
            return all(
                not nodes.get(_pod_node(pod) or "", False)
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                for pod in pods
            )

    # ----------------------------------------------------------------------------- reconcile

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        """Adopt complete gangs of live attempts; delete everything of other attempts; LOST for
        live attempts whose gang is gone or incomplete (a half-launched gang cannot rendezvous)."""
        self.start()
        pods = self._list(self.api.list_namespaced_pod)
        keys = {_meta(obj)["name"]: _attempt_id(obj) for obj in self._list(self.api.list_namespaced_secret)}
        keys.update(
            {_meta(obj)["name"]: _attempt_id(obj) for obj in self._list(self.api.list_namespaced_service)}
        )
        by_attempt: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_attempt.setdefault(_attempt_id(pod) or "", []).append(pod)
            keys.setdefault(str((_meta(pod).get("labels") or {}).get(m.ATTEMPT_LABEL)), _attempt_id(pod))

        reports: list[WorkerReport] = []
        grace = self.config.termination_grace_s
        for key, attempt_id in keys.items():
            if attempt_id not in live:
                names = [_meta(pod)["name"] for pod in by_attempt.get(attempt_id or "", [])]
                log.info(
                    "reconcile: deleting orphan attempt %s (%d pods)",
                    attempt_id,
                    len(names),
                    extra={"attempt_id": attempt_id},
                )
                self._delete_attempt_objects(key, names, grace)
        with self._lock:
            for attempt_id in list(self._attempts):
                if attempt_id not in live:
                    del self._attempts[attempt_id]
        for attempt_id, request in live.items():
            key = m.attempt_key(attempt_id)
            gang = len(request.placement.slices)
            found = {rank for pod in by_attempt.get(attempt_id, []) if (rank := _rank(pod)) is not None}
            if found == set(range(gang)):
                with self._lock:
                    self._attempts.setdefault(
                        attempt_id,
                        _Attempt(
                            attempt_id,
                            key,
                            gang,
                            {r: s.node for r, s in enumerate(request.placement.slices)},
                            request.fencing_token,
                        ),
                    )
                    for pod in by_attempt[attempt_id]:
                        self._pods.setdefault(_meta(pod)["name"], pod)
                continue
            reason = (
                "no worker pods found after a restart"
                if not found
                else f"only node ranks {sorted(found)} of {gang} found after a restart: the gang cannot meet"
            )
            names = [_meta(pod)["name"] for pod in by_attempt.get(attempt_id, [])]
            self._delete_attempt_objects(key, names, grace)
            report = WorkerReport(attempt_id, Outcome.LOST, self._clock(), None, reason, disrupted=True)
            with self._lock:
                self._attempts[attempt_id] = _Attempt(
                    attempt_id, key, gang, {}, request.fencing_token, ending=report
                )
            reports.append(report)
        return reports

    # ----------------------------------------------------------------------------- logs

    def _pod_names(self, attempt_id: str) -> list[str]:
        pods = [pod for pod in self._list(self.api.list_namespaced_pod) if _attempt_id(pod) == attempt_id]
        return [_meta(pod)["name"] for pod in sorted(pods, key=lambda pod: _rank(pod) or 0)]

    def _log_lines(self, name: str, follow: bool) -> Iterator[str]:
        response = self.api.read_namespaced_pod_log(
            name, self._ns, container=m.WORKER_CONTAINER, follow=follow, _preload_content=False
        )
        buffer = b""
        try:
            for chunk in response.stream(4096):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if buffer:
                yield buffer.decode(errors="replace")
        finally:
            response.release_conn()

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        """Every rank's output; lines are prefixed with the node rank when the gang has several pods.
        With `follow`, the ranks stream side by side until every worker container ends."""
        names = self._pod_names(attempt_id)
        prefix = len(names) > 1

        def label(rank: int, line: str) -> str:
            return f"[node-rank {rank}] {line}" if prefix else line

        if not follow:
            for rank, name in enumerate(names):
                for line in self._log_lines(name, False):
                    yield label(rank, line)
            return
        lines: queue.Queue[tuple[int, str] | None] = queue.Queue()

        def pump(rank: int, name: str) -> None:
            try:
                for line in self._log_lines(name, True):
                    lines.put((rank, line))
            except ApiException as error:
                lines.put((rank, f"(log of {name} unavailable: {error.status} {error.reason})"))
            finally:
                lines.put(None)

        for rank, name in enumerate(names):
            threading.Thread(target=pump, args=(rank, name), daemon=True).start()
        running = len(names)
        while running:
            item = lines.get()
            if item is None:
                running -= 1
            else:
                yield label(*item)
