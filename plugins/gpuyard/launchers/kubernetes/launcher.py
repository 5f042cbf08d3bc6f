"""KubernetesLauncher: attempts become pods on the chosen nodes; pod watches become WorkerReports.

Level-triggered like a controller. `launch` creates, in the team's namespace, the attempt's Secret
(the owner), its NetworkPolicy, its headless Service and one pod per node rank; a 409 Conflict means
an earlier launch (maybe before a restart) got there first, and the existing object is adopted.
Background threads watch nodes and the pods of each team namespace in use (list, then watch from
the list's resourceVersion; 410 Gone re-lists) and feed a queue; `observe` drains it into a cache of
pods and nodes and decides each attempt's fate from ALL its pods (fates.py). Once the store has an
attempt's ending (`acknowledge`), all its objects are deleted: nothing outlives its attempt (its logs
outlive it in the cluster's log collection, not in its pods).

Its rights are namespaced (manifests.LAUNCHER_RULES in each team namespace) plus reading nodes: it
never lists across namespaces, so it learns the team namespaces from `teams` (the store's teams),
from its launches and from the attempts it reconciles.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as kubeconfig
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpuyard.clock import Clock, utcnow
from gpuyard.launchers.base import LaunchRequest, Outcome, WorkerReport
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.launchers.kubernetes.fates import PodFate, attempt_fate, gone_fate, pod_fate, starting
from gpuyard.settings.kubernetes import KubernetesConfig

log = logging.getLogger(__name__)

GONE_WHY = "pod deleted before it ended: its node was removed, or it was deleted outside gpuyard"


NO_NAMESPACE = "gpuyard kubernetes namespaces --team {team} | kubectl apply -f -"


class LaunchError(RuntimeError):
    """The API refused to create an attempt's objects (other than the 409 that means: already there)."""


def load_api(config: KubernetesConfig) -> k8s.CoreV1Api:
    """A client of the API `config` names: its pod's service account in a cluster, else a kubeconfig's
    context. A client of its own, never the module's default: each site's reaches its own cluster."""
    if config.in_cluster:
        configuration = k8s.Configuration()
        kubeconfig.load_incluster_config(client_configuration=configuration)
        return k8s.CoreV1Api(k8s.ApiClient(configuration))
    # $KUBECONFIG read now: the client reads it once, when first imported
    path = config.kubeconfig or os.environ.get("KUBECONFIG")
    return k8s.CoreV1Api(kubeconfig.new_client_from_config(config_file=path, context=config.context))


@dataclass
class _Attempt:
    attempt_id: str
    namespace: str
    key: str
    gang_size: int
    nodes: dict[int, str]
    token: int
    seen: set[int] = field(default_factory=set)
    running: bool = False  # every pod runs on a Ready node, as last observed
    starting: str | None = None  # how its pods are coming up, while every one runs or starts
    launched_at: float = field(default_factory=time.monotonic)  # (or adopted): its start deadline counts
    running_acknowledged: bool = False
    ending: WorkerReport | None = None  # repeated by observe() until acknowledged
    cancelled: bool = False


@dataclass(frozen=True)
class _Event:
    kind: str  # "pod" or "node"
    type: str  # ADDED, MODIFIED, DELETED, or SYNC (a full listing in `items`)
    namespace: str = ""  # of a pod event: the namespace its watch covers
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


def _status_message(error: ApiException) -> str | None:
    """The API server's own words (a Status object's message), when its answer carries one."""
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return None


def _key_selector(key: str) -> str:
    return f"{m.SELECTOR},{m.ATTEMPT_LABEL}={key}"


def _terminating(pod: Mapping[str, Any] | None) -> bool:
    """Deleted and in its grace period (a kubelet stops its containers, then the object goes)."""
    return pod is not None and bool(_meta(pod).get("deletionTimestamp"))


def _held_for_us_alone(pod: Mapping[str, Any]) -> bool:
    """Deleted, and held only by the launcher's outcome finalizer: no kubelet will do more with it."""
    meta = _meta(pod)
    return bool(meta.get("deletionTimestamp")) and list(meta.get("finalizers") or ()) == [m.OUTCOME_FINALIZER]


def _ours(obj: Mapping[str, Any]) -> bool:
    """Checked on our side too, so a list that ignored the label selector cannot hand us strangers."""
    return (_meta(obj).get("labels") or {}).get(m.MANAGED_BY) == "gpuyard" and _attempt_id(obj) is not None


class KubernetesLauncher:
    def __init__(
        self,
        config: KubernetesConfig,
        api: k8s.CoreV1Api | None = None,
        *,
        teams: Callable[[], Iterable[str]] = tuple,
        clock: Clock = utcnow,
        backoff_s: float = 0.5,
    ):
        self.config = config
        self.api = api if api is not None else load_api(config)
        self.networking = k8s.NetworkingV1Api(self.api.api_client)
        self._teams = teams
        self._clock = clock
        self._backoff_s = backoff_s
        self._timeout = config.request_timeout_s
        self._lock = threading.RLock()
        self._events: queue.Queue[_Event] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: set[watch.Watch] = set()
        self._attempts: dict[str, _Attempt] = {}
        self._watched: set[str] = set()  # namespaces whose pods a thread watches
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, pod name) -> last seen object
        self._deleted: dict[tuple[str, str], dict[str, Any]] = {}  # its last object when it was deleted
        self._nodes: dict[str, bool] | None = None  # node name -> Ready; None until the first listing
        # (namespace, attempt key) -> (attempt id, settled: the store has its outcome): attempts being
        # torn down (ended, or cancelled) whose policy, Service and Secret wait for their pods to be
        # gone; torn down again each `observe` until none remains
        self._tearing_down: dict[tuple[str, str], tuple[str, bool]] = {}
        self.relists = 0  # listings after the first, e.g. after 410 Gone (for metrics and tests)

    # ----------------------------------------------------------------------------- lifecycle

    def _spawn(self, name: str, kind: str, list_fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        thread = threading.Thread(
            target=self._watch_loop, args=(kind, list_fn, kwargs), name=name, daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def start(self) -> None:
        """Start the node watch (idempotent; launch, observe and reconcile call it)."""
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            self._spawn("gpuyard-watch-node", "node", self.api.list_node, {})

    def watch_namespace(self, namespace: str) -> None:
        """Watch the pods of this team namespace from now on (idempotent)."""
        self.start()
        with self._lock:
            if namespace in self._watched:
                return
            self._watched.add(namespace)
            kwargs = {"namespace": namespace, "label_selector": m.SELECTOR}
            self._spawn(f"gpuyard-watch-pod-{namespace}", "pod", self.api.list_namespaced_pod, kwargs)

    def close(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        self._watched = set()

    def __enter__(self) -> KubernetesLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch_loop(self, kind: str, list_fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        """List, then watch from the list's resourceVersion; resume after a timeout, re-list after 410."""
        version: str | None = None
        namespace = str(kwargs.get("namespace", ""))
        listed = False
        delay = self._backoff_s
        while not self._stop.is_set():
            try:
                if version is None:
                    response = list_fn(**kwargs, _preload_content=False, _request_timeout=self._timeout)
                    body = json.loads(response.data)
                    version = _meta(body).get("resourceVersion") or ""
                    items = tuple(item for item in body.get("items") or () if kind == "node" or _ours(item))
                    self._events.put(_Event(kind, "SYNC", namespace, items=items))
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
                        events += 1
                        raw = event["raw_object"]
                        version = _meta(raw).get("resourceVersion") or version
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED") and (
                            kind == "node" or _ours(raw)
                        ):
                            self._events.put(_Event(kind, event["type"], namespace, raw))
                finally:
                    self._watches.discard(w)
                if not events and time.monotonic() - started < 1.0:  # ended at once: do not spin
                    self._stop.wait(delay)
                    delay = min(delay * 2, 30.0)
                else:
                    delay = self._backoff_s
            except ApiException as error:
                if error.status == 410:
                    log.info("%s watch %s expired (410 Gone): re-listing", kind, namespace or "(cluster)")
                    version = None
                    continue
                log.warning(
                    "%s watch %s: API error %s %s; retrying",
                    kind,
                    namespace or "(cluster)",
                    error.status,
                    error.reason,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
            except Exception as error:  # connection reset, read timeout, server restart
                if self._stop.is_set():
                    break
                log.warning("%s watch %s: %s; retrying", kind, namespace or "(cluster)", error)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)

    # ----------------------------------------------------------------------------- launch

    def _create(
        self, kind: str, body: dict[str, Any], create: Callable[..., Any], read: Callable[..., Any]
    ) -> Any:
        """Create, or adopt what a previous launch of the same attempt created (409 Conflict)."""
        name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
        try:
            response = create(ns, body, _preload_content=False, _request_timeout=self._timeout)
            return json.loads(response.data)
        except ApiException as error:
            if error.status == 404:  # the only thing missing on a create: the namespace
                team = ns.removeprefix(self.config.team_namespace_prefix)
                raise LaunchError(
                    f"creating {kind} {ns}/{name}: namespace {ns} not found (404): a cluster admin "
                    f"creates it with `{NO_NAMESPACE.format(team=team)}`"
                ) from error
            if error.status != 409:  # e.g. 403 with the team namespace's quota exceeded, which it names
                said = f": {_status_message(error)}" if _status_message(error) else ""
                raise LaunchError(
                    f"creating {kind} {ns}/{name}: {error.status} {error.reason}{said}"
                ) from error
        response = read(name, ns, _preload_content=False, _request_timeout=self._timeout)
        existing = json.loads(response.data)
        wanted, found = _attempt_id(body), _attempt_id(existing)
        if found != wanted:
            raise LaunchError(f"{kind} {ns}/{name} exists but belongs to attempt {found!r}, not {wanted!r}")
        log.info(
            "adopted existing %s %s/%s of attempt %s", kind, ns, name, wanted, extra={"attempt_id": wanted}
        )
        return existing

    def launch(self, request: LaunchRequest) -> None:
        self.start()
        key = m.attempt_key(request.attempt_id)
        try:
            namespace = m.attempt_namespace(request, self.config)
        except ValueError as error:
            raise LaunchError(str(error)) from error
        with self._lock:
            self._attempts.setdefault(
                request.attempt_id,
                _Attempt(
                    attempt_id=request.attempt_id,
                    namespace=namespace,
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
        self.watch_namespace(namespace)
        objects = m.build_attempt(request, self.config, owner)
        net = self.networking
        self._create(
            "networkpolicy",
            objects.network_policy,
            net.create_namespaced_network_policy,
            net.read_namespaced_network_policy,
        )
        self._create("service", objects.service, api.create_namespaced_service, api.read_namespaced_service)
        for pod in objects.pods:
            self._create("pod", pod, api.create_namespaced_pod, api.read_namespaced_pod)

    # ----------------------------------------------------------------------------- cancel and cleanup

    def _delete(self, delete: Callable[..., Any], name: str, ns: str, **kwargs: Any) -> None:
        try:
            delete(name, ns, _request_timeout=self._timeout, **kwargs)
        except ApiException as error:
            if error.status != 404:
                raise

    def _delete_pods(self, ns: str, names: list[str], grace_s: float) -> None:
        for name in names:
            self._delete(self.api.delete_namespaced_pod, name, ns, grace_period_seconds=max(int(grace_s), 0))

    def _tear_down(self, ns: str, key: str, attempt_id: str | None, grace_s: float, *, settled: bool) -> None:
        """Delete the attempt's pods with the grace period (one already terminating keeps its own),
        and its NetworkPolicy, Service and owner Secret once no pod of it remains: a pod in its grace
        period may still write its preemption checkpoint (the policy lets it reach the store) and
        meet its gang (the Service). Until then the attempt is torn down again each `observe`.
        `settled`: the store has the attempt's outcome (or none will be asked of this launcher), so
        each pod's outcome finalizer goes once it is the last: its containers have stopped."""
        self._delete_pods(
            ns, [_meta(p)["name"] for p in self._key_pods(ns, key) if not _terminating(p)], grace_s
        )
        remaining = self._key_pods(ns, key)
        if settled:  # a pod let go is gone: deleted, with no finalizer left
            remaining = [pod for pod in remaining if not self._let_go(ns, pod)]
        if remaining:
            with self._lock:
                self._tearing_down[(ns, key)] = (attempt_id or "", settled)
            return
        self._delete(self.networking.delete_namespaced_network_policy, key, ns)
        self._delete(self.api.delete_namespaced_service, key, ns)
        self._delete(self.api.delete_namespaced_secret, key, ns, propagation_policy="Background")
        with self._lock:
            self._tearing_down.pop((ns, key), None)

    def _let_go(self, ns: str, pod: Mapping[str, Any]) -> bool:
        """Remove the pod's outcome finalizer once it is the only one left: a node's kubelet (the
        emulated cluster's agent holds its own until the containers stopped) is done with the pod, so
        the list written back cannot drop another's. True when the pod is gone."""
        if not _held_for_us_alone(pod):
            return False
        try:
            self.api.patch_namespaced_pod(
                _meta(pod)["name"], ns, {"metadata": {"finalizers": None}}, _request_timeout=self._timeout
            )
        except ApiException as error:
            if error.status != 404:
                raise
        return True

    def _list(self, list_fn: Callable[..., Any], ns: str, selector: str = m.SELECTOR) -> list[dict[str, Any]]:
        """Our objects in `ns`; none when the namespace does not exist."""
        try:
            response = list_fn(
                ns, label_selector=selector, _preload_content=False, _request_timeout=self._timeout
            )
        except ApiException as error:
            if error.status == 404:
                return []
            raise
        return [item for item in json.loads(response.data).get("items") or () if _ours(item)]

    def _namespaces(self) -> set[str]:
        """Every team namespace this launcher knows of: watched, of its attempts, of the store's teams."""
        with self._lock:
            known = set(self._watched) | {a.namespace for a in self._attempts.values()}
        for team in self._teams():
            try:
                known.add(m.team_namespace(team, self.config))
            except ValueError:  # a team whose name cannot be a namespace never launched anything
                continue
        return known

    def _namespace_of(self, attempt_id: str) -> str | None:
        """The attempt's namespace: known, else found by its objects (the owner Secret goes last)."""
        with self._lock:
            attempt = self._attempts.get(attempt_id)
        if attempt is not None:
            return attempt.namespace
        selector = _key_selector(m.attempt_key(attempt_id))
        for ns in sorted(self._namespaces()):
            for list_fn in (self.api.list_namespaced_secret, self.api.list_namespaced_pod):
                if any(_attempt_id(obj) == attempt_id for obj in self._list(list_fn, ns, selector)):
                    return ns
        return None

    def _key_pods(self, ns: str, key: str) -> list[dict[str, Any]]:
        """The pods of the attempt named `key` (selected here too: an API double may ignore selectors)."""
        return [
            pod
            for pod in self._list(self.api.list_namespaced_pod, ns, _key_selector(key))
            if (_meta(pod).get("labels") or {}).get(m.ATTEMPT_LABEL) == key
        ]

    def _attempt_pods(self, ns: str, attempt_id: str) -> list[dict[str, Any]]:
        selector = _key_selector(m.attempt_key(attempt_id))
        return [
            pod
            for pod in self._list(self.api.list_namespaced_pod, ns, selector)
            if _attempt_id(pod) == attempt_id
        ]

    def cancel(self, attempt_id: str, *, grace_s: float) -> None:
        """SIGTERM now (pod deletion), SIGKILL by the kubelet after `grace_s`; the attempt's other
        objects go once its pods have (`_tear_down`)."""
        key = m.attempt_key(attempt_id)
        with self._lock:
            attempt = self._attempts.get(attempt_id)
            if attempt is not None:
                attempt.cancelled = True
        ns = self._namespace_of(attempt_id)
        if ns is None:
            return  # nothing of it in any team namespace
        # An attempt this launcher follows has its pods' exits read before they go; no one reads another's.
        self._tear_down(ns, key, attempt_id, grace_s, settled=attempt is None)

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
        ns = event.namespace
        if event.type == "SYNC":  # the whole of one namespace
            listed = {(ns, _meta(pod)["name"]): dict(pod) for pod in event.items}
            for where in [w for w in self._pods if w[0] == ns and w not in listed]:  # vanished unwatched
                self._deleted[where] = self._pods.pop(where)
            self._pods.update(listed)
            return
        where = (ns, _meta(event.obj).get("name", ""))
        if event.type == "DELETED":
            self._pods.pop(where, None)
            self._deleted[where] = event.obj
        else:
            self._pods[where] = event.obj
            self._deleted.pop(where, None)

    def _rank_fate(self, attempt: _Attempt, rank: int) -> PodFate | None:
        name = (attempt.namespace, m.pod_name(attempt.key, rank))
        pod = self._pods.get(name)
        if pod is not None:
            attempt.seen.add(rank)
            fate = pod_fate(pod, m.WORKER_CONTAINER)
            node = _pod_node(pod) or attempt.nodes.get(rank)
            if not fate.ended and self._nodes is not None and node is not None and node not in self._nodes:
                return PodFate(Outcome.LOST, f"node {node} was removed from the cluster")
            if fate.outcome is None and _held_for_us_alone(pod):
                # deleted before its worker started, and its node is done with it: it never will
                return gone_fate(
                    None, cancelled=attempt.cancelled, why="pod deleted before its worker started"
                )
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
            pod = self._pods.get((attempt.namespace, m.pod_name(attempt.key, rank)))
            node = (_pod_node(pod) if pod is not None else None) or attempt.nodes.get(rank)
            if node is None or not self._nodes.get(node, False):
                return False
        return True

    def observe(self) -> list[WorkerReport]:
        self.start()
        reports: list[WorkerReport] = []
        teardown: list[tuple[str, str]] = []
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
                    attempt.starting = None if attempt.running or fate.ended else self._starting(attempt)
                    if not attempt.running and not fate.ended and self._past_start_deadline(attempt):
                        fate = PodFate(
                            Outcome.FAILED,
                            f"did not start within start_timeout_s ({self.config.start_timeout_s:g} s): "
                            f"{attempt.starting or 'its pods were not all placed and starting'}",
                        )
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
                        # The gang ended: stop every rank that has not (seen by the watch or not),
                        # leaving one already stopping its own grace period (a shorter one cuts it).
                        for rank in range(attempt.gang_size):
                            where = (attempt.namespace, m.pod_name(attempt.key, rank))
                            if (rank not in fates or not fates[rank].ended) and not _terminating(
                                self._pods.get(where)
                            ):
                                teardown.append(where)
                if attempt.ending is not None:
                    reports.append(attempt.ending)
                elif attempt.running and not attempt.running_acknowledged:
                    reports.append(WorkerReport(attempt.attempt_id, Outcome.RUNNING, self._clock()))
        for ns, name in teardown:
            self._delete_pods(ns, [name], self.config.termination_grace_s)
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
            self._tearing_down[(attempt.namespace, attempt.key)] = (attempt.attempt_id, True)
        self._clean_up()

    def _clean_up(self) -> None:
        """Tear down every attempt whose ending the store has, or that was cancelled and still has
        pods. An API error leaves the attempt for the next observe, and a restarted launcher's
        reconcile deletes what is not live."""
        with self._lock:
            tearing_down = dict(self._tearing_down)
        for (ns, key), (attempt_id, settled) in tearing_down.items():
            try:
                self._tear_down(ns, key, attempt_id, self.config.termination_grace_s, settled=settled)
            except Exception as error:  # API errors, connection resets: retried next pass
                log.warning(
                    "cleaning up attempt objects %s/%s: %s; retrying",
                    ns,
                    key,
                    error,
                    extra={"attempt_id": attempt_id},
                )

    def alive(self) -> dict[str, int]:
        """Attempts whose every pod runs (worker container not terminated) on a Ready node."""
        with self._lock:
            return {a.attempt_id: a.token for a in self._attempts.values() if a.running and a.ending is None}

    def starting(self) -> dict[str, int]:
        """Attempts whose every pod runs or is coming up (image pull, container creation) on a Ready
        node, within the start deadline: a slow start is alive, not lost."""
        with self._lock:
            return {a.attempt_id: a.token for a in self._attempts.values() if a.starting and a.ending is None}

    def _starting(self, attempt: _Attempt) -> str | None:
        """How the attempt's pods are coming up ("node rank 1: ContainerCreating"), when each one
        runs or starts on a Ready node; None otherwise."""
        how: list[str] = []
        for rank in range(attempt.gang_size):
            pod = self._pods.get((attempt.namespace, m.pod_name(attempt.key, rank)))
            if pod is None or self._nodes is None or not self._nodes.get(_pod_node(pod) or "", False):
                return None
            if pod_fate(pod, m.WORKER_CONTAINER).outcome is Outcome.RUNNING:
                continue
            reason = starting(pod, m.WORKER_CONTAINER)
            if reason is None:
                return None
            how.append(f"node rank {rank}: {reason}" if attempt.gang_size > 1 else reason)
        return ", ".join(how) or None

    def _past_start_deadline(self, attempt: _Attempt) -> bool:
        return time.monotonic() - attempt.launched_at > self.config.start_timeout_s

    def release(self, attempt_id: str) -> bool:
        """Delete the attempt's objects at once; True when none of its pods can still run: each one
        gone, ended, or on a node removed from the cluster. A pod on a NotReady node is not known
        stopped (a partition: its node stopped reporting, its worker may run on): False."""
        self.cancel(attempt_id, grace_s=0)
        ns = self._namespace_of(attempt_id)
        pods = self._attempt_pods(ns, attempt_id) if ns is not None else []
        with self._lock:
            nodes = self._nodes or {}
            return all(
                (_pod_node(pod) or "") not in nodes
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                for pod in pods
            )

    # ----------------------------------------------------------------------------- reconcile

    def reconcile(self, live: Mapping[str, LaunchRequest]) -> list[WorkerReport]:
        """Adopt complete gangs of launched live attempts; delete everything of other attempts (in
        every team namespace known); LOST for launched live attempts whose gang is gone or incomplete
        (a half-launched gang cannot rendezvous). An attempt reserved but not launched keeps whatever
        of it exists: its launch follows, and adopts what is there (same names) and adds the rest."""
        self.start()
        wanted: dict[str, str] = {}  # attempt id -> its namespace
        for attempt_id, request in live.items():
            try:
                wanted[attempt_id] = m.attempt_namespace(request, self.config)
            except ValueError:
                wanted[attempt_id] = ""  # cannot have launched: reported lost below
        by_attempt: dict[str, list[dict[str, Any]]] = {}
        grace = self.config.termination_grace_s
        for ns in sorted(self._namespaces() | {n for n in wanted.values() if n}):
            pods = self._list(self.api.list_namespaced_pod, ns)
            keys: dict[str, str | None] = {}  # object name (the attempt key) -> attempt id
            for list_fn in (
                self.api.list_namespaced_secret,
                self.api.list_namespaced_service,
                self.networking.list_namespaced_network_policy,
            ):
                keys.update({_meta(obj)["name"]: _attempt_id(obj) for obj in self._list(list_fn, ns)})
            for pod in pods:
                by_attempt.setdefault(_attempt_id(pod) or "", []).append(pod)
                keys.setdefault(str((_meta(pod).get("labels") or {}).get(m.ATTEMPT_LABEL)), _attempt_id(pod))
            for key, owner in keys.items():
                if owner is None or owner not in live or wanted[owner] != ns:
                    names = [_meta(pod)["name"] for pod in pods if _attempt_id(pod) == owner]
                    log.info(
                        "reconcile: deleting orphan attempt %s in %s (%d pods)",
                        owner,
                        ns,
                        len(names),
                        extra={"attempt_id": owner},
                    )
                    self._tear_down(ns, key, owner, grace, settled=True)  # the store tracks it no more
                    by_attempt.pop(owner or "", None)
            if pods or ns in wanted.values():
                self.watch_namespace(ns)
        with self._lock:
            for attempt_id in list(self._attempts):
                if attempt_id not in live:
                    del self._attempts[attempt_id]

        reports: list[WorkerReport] = []
        for attempt_id, request in live.items():
            if not request.launched_before:
                continue  # a replica that stopped mid-launch left part of it: the launch completes it
            key, ns = m.attempt_key(attempt_id), wanted[attempt_id]
            gang = len(request.placement.slices)
            found = {rank for pod in by_attempt.get(attempt_id, []) if (rank := _rank(pod)) is not None}
            if found == set(range(gang)):
                with self._lock:
                    self._attempts.setdefault(
                        attempt_id,
                        _Attempt(
                            attempt_id,
                            ns,
                            key,
                            gang,
                            {r: s.node for r, s in enumerate(request.placement.slices)},
                            request.fencing_token,
                        ),
                    )
                    for pod in by_attempt[attempt_id]:
                        self._pods.setdefault((ns, _meta(pod)["name"]), pod)
                continue
            reason = (
                "no worker pods found after a restart"
                if not found
                else f"only node ranks {sorted(found)} of {gang} found after a restart: the gang cannot meet"
            )
            if ns:
                self._tear_down(ns, key, attempt_id, grace, settled=True)  # reported LOST below
            report = WorkerReport(attempt_id, Outcome.LOST, self._clock(), None, reason, disrupted=True)
            with self._lock:
                self._attempts[attempt_id] = _Attempt(
                    attempt_id, ns, key, gang, {}, request.fencing_token, ending=report
                )
            reports.append(report)
        return reports

    # ----------------------------------------------------------------------------- logs

    def _pod_names(self, attempt_id: str) -> tuple[str, list[str]]:
        ns = self._namespace_of(attempt_id)
        pods = self._attempt_pods(ns, attempt_id) if ns is not None else []
        return ns or "", [_meta(pod)["name"] for pod in sorted(pods, key=lambda pod: _rank(pod) or 0)]

    def _log_lines(self, ns: str, name: str, follow: bool) -> Iterator[str]:
        response = self.api.read_namespaced_pod_log(
            name, ns, container=m.WORKER_CONTAINER, follow=follow, _preload_content=False
        )
        buffer = b""
        try:
            for chunk in response.stream(4096):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace") + "\n"
            if buffer:  # the last line, unfinished
                yield buffer.decode(errors="replace")
        finally:
            response.release_conn()

    def logs(self, attempt_id: str, *, follow: bool = False) -> Iterator[str]:
        """Every rank's output; lines are prefixed with the node rank when the gang has several pods.
        With `follow`, the ranks stream side by side until every worker container ends."""
        ns, names = self._pod_names(attempt_id)
        prefix = len(names) > 1

        def label(rank: int, line: str) -> str:
            return f"[node-rank {rank}] {line}" if prefix else line

        if not follow:
            for rank, name in enumerate(names):
                for line in self._log_lines(ns, name, False):
                    yield label(rank, line)
            return
        lines: queue.Queue[tuple[int, str] | None] = queue.Queue()

        def pump(rank: int, name: str) -> None:
            try:
                for line in self._log_lines(ns, name, True):
                    lines.put((rank, line))
            except ApiException as error:
                lines.put((rank, f"(log of {name} unavailable: {error.status} {error.reason})\n"))
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
