"""kmock's Kubernetes emulator as an API server on a real HTTP port, in a thread of its own.

The synchronous `kubernetes` client (and the launcher's watch threads) talk to it over HTTP exactly as
they would to an API server. The additions to kmock's emulator are what a real API server does on
every write and its clients rely on: a `uid` and `creationTimestamp` on creation, a growing
`resourceVersion`, 404 for an object created in a namespace that does not exist, `watch=True` read as
`true`, and watches whose history holds: a list says the version it shows, a watch started from an
older one than the newest change is answered `410 Expired` (kmock keeps no history to replay, as an
API server whose watch cache no longer holds that version: the client lists again), and no change
between a watch's first objects and its stream is lost; a watch ends after its `timeoutSeconds`.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import yaml
from kmock import action

SERVED = (  # served even before the first object
    "v1/pods",
    "v1/services",
    "v1/secrets",
    "v1/nodes",
    "v1/resourcequotas",
    "v1/serviceaccounts",
    "networking.k8s.io/v1/networkpolicies",
    "rbac.authorization.k8s.io/v1/roles",
    "rbac.authorization.k8s.io/v1/rolebindings",
)


class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the metadata a real API server stamps on writes."""

    _versions = itertools.count(1000)
    _newest = "999"  # the resourceVersion of the newest change (a deletion's included)
    # kmock cannot route /api/v1/namespaces (it reads 'namespaces' as the start of a namespaced path):
    # the namespaces that exist are kept here (Cluster.apply adds them). The launcher never reads them.
    namespaces: dict[str, dict[str, Any]]
    # kmock records every request for a test's assertions and matches each new one against that record,
    # so a long-running cluster slows down as it serves (an hour-long run spent a core on it): a cluster
    # that keeps no record forgets each request once it is answered.
    keeps_requests = True

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.namespaces = {}
        for resource in SERVED:
            self.resources[resource] = {}

    async def _handle(self, request: Any) -> Any:
        try:
            self._stamp(request)
            return await super()._handle(request)
        finally:
            if not self.keeps_requests:
                self._requests[:] = [kept for kept in self._requests if kept is not request]

    def _stamp(self, request: Any) -> None:
        """What the API server adds to a request before serving it (see the module's docstring)."""
        if request.method == "GET" and str(request.params.get("watch", "")).lower() == "true":
            # the Python client sends watch=True, which the API server's ParseBool accepts; kmock wants 'true'
            # (kmock matches requests by identity, so the parsed request is corrected in place)
            object.__setattr__(request, "action", action.WATCH)
        data = request.data if isinstance(request.data, dict) else None
        if (
            request.resource is not None
            and data is not None
            and request.action in (action.CREATE, action.UPDATE)
        ):
            meta = data.setdefault("metadata", {})
            namespace = request.namespace or meta.get("namespace")
            if request.action == action.CREATE and namespace and not self.has_namespace(namespace):
                raise kmock.KubernetesObjectNotFoundError(
                    reason="NotFound", message=f'namespaces "{namespace}" not found'
                )
            meta["resourceVersion"] = self._newest = str(next(self._versions))
            if request.action == action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault(
                    "creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                )
        if request.action == action.DELETE and request.resource is not None and request.name is not None:
            self._newest = str(next(self._versions))
            self._mark_grace(request, data)

    def _mark_grace(self, request: Any, options: dict[str, Any] | None) -> None:
        """A delete of an object that finalizers hold: its grace period, as the API server records it
        (`deletionGracePeriodSeconds`: the request's, else the pod's `terminationGracePeriodSeconds`,
        else 30), for the node agent that stops its containers. kmock then marks it deleted."""
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return
        stored = self._objects[key]
        meta = stored.get("metadata", {})
        if not meta.get("finalizers") or meta.get("deletionTimestamp"):
            return
        asked = (options or {}).get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
        grace = (
            asked if asked is not None else stored.get("spec", {}).get("terminationGracePeriodSeconds", 30)
        )
        stored.patch({"metadata": {"deletionGracePeriodSeconds": int(grace)}})

    async def _serve_list(self, request: Any) -> Any:
        newest = self._newest  # read first: a change meanwhile makes a watch from it expire, not vanish
        listed = await super()._serve_list(request)
        listed["metadata"]["resourceVersion"] = newest
        return listed

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        """The objects there are now, then every change, from the request's `resourceVersion` when it is
        the newest (else `410 Expired`); ended after `timeoutSeconds` as an API server ends it. kmock's
        own watch marks its stream after sending the objects, so a change meanwhile was lost."""
        yield b""  # the headers: the client is streaming
        timeout = float(request.params.get("timeoutSeconds") or 0)
        bus = self._buses[request.resource]
        marker = await bus.mark()  # before the objects are read: a change after them is streamed
        try:
            asked = str(request.params.get("resourceVersion") or "")
            async with self._lock:
                newest = self._newest
                present = [
                    obj.raw
                    for (resource, namespace, _), obj in self._objects.items()
                    if resource == request.resource and not obj.deleted and _within(request, namespace)
                ]
            if asked not in ("", "0") and asked != newest:
                yield {"type": "ERROR", "object": expired_status(asked, newest)}
                return
            for raw in present:
                yield {"type": "ADDED", "object": raw}
            changes = aiter(bus.stream(since=marker))
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if timeout and remaining <= 0:
                    return
                try:
                    event = await asyncio.wait_for(anext(changes), remaining if timeout else None)
                except (TimeoutError, StopAsyncIteration):
                    return
                if _within(request, event.get("object", {}).get("metadata", {}).get("namespace")):
                    yield event
        finally:
            await bus.unmark(marker)

    def has_namespace(self, name: str) -> bool:
        return name in self.namespaces

    def apply(self, api_client: Any, objects: list[dict[str, Any]]) -> None:
        """Create these objects, as `kubectl apply -f` of their YAML would on an empty cluster (kmock
        serves no namespaces: those that exist are this emulator's)."""
        from kubernetes import utils

        for obj in objects:
            if obj["kind"] == "Namespace":
                self.namespaces[obj["metadata"]["name"]] = obj
            else:
                utils.create_from_dict(api_client, obj)

    def patch_silently(self, plural: str, name: str, patch: dict[str, Any]) -> None:
        """Change an object without a watch event: what a watcher misses while disconnected."""
        for (resource, _, object_name), obj in self.objects.items():
            if resource.plural == plural and object_name == name and not obj.deleted:
                obj.patch(patch)
                self._newest = str(next(self._versions))  # a change all the same: a watch from before expires
                return
        raise KeyError(f"{plural}/{name}")

    def delete_silently(self, plural: str, name: str, *, force: bool = False) -> None:
        """Delete an object without a watch event (a watcher disconnected missed it): marked for
        deletion while finalizers hold it, as a delete does, or gone at once with `force` (its
        finalizers dropped, as a pod garbage collector or an operator does)."""
        for (resource, _, object_name), obj in self.objects.items():
            if resource.plural == plural and object_name == name and not obj.deleted:
                if obj.get("metadata", {}).get("finalizers") and not force:
                    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    obj.patch({"metadata": {"deletionTimestamp": now}})
                else:
                    obj.delete()
                self._newest = str(next(self._versions))
                return
        raise KeyError(f"{plural}/{name}")


def _within(request: Any, namespace: str | None) -> bool:
    """Whether an object in `namespace` is one the request covers (a cluster-wide one covers all)."""
    return request.namespace is None or namespace == request.namespace


def expired_status(asked: str, newest: str) -> dict[str, Any]:
    """The Status of a watch from a version the server no longer holds (410 Expired)."""
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": f"too old resource version: {asked} ({newest})",
    }


def write_kubeconfig(url: str, path: Path) -> Path:
    """A kubeconfig file pointing at the API server at `url`, as an operator's ~/.kube/config would."""
    context = {"cluster": "emulated", "user": "gpuyard"}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "gpuyard", "user": {"token": "t"}}],
        "contexts": [{"name": "emulated", "context": context}],
        "current-context": "emulated",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class ApiServer:
    """`ApiServerEmulator` serving on 127.0.0.1 (a free port) from a thread and event loop of its own,
    until `stop()`; `url` is its address."""

    def __init__(self, keeps_requests: bool = True) -> None:
        """`keeps_requests`: record every request for the test's assertions (`emulator.requests`); a
        long-running cluster does not."""
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        ready = threading.Event()
        found: dict[str, Any] = {}

        async def serve() -> None:
            self._stop = asyncio.Event()
            async with ApiServerEmulator() as emulator, kmock.Server(emulator) as server:
                emulator.keeps_requests = keeps_requests
                found["emulator"], found["url"] = emulator, str(server.url).rstrip("/")
                ready.set()
                await self._stop.wait()

        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start within 10 s")
        self.emulator: ApiServerEmulator = found["emulator"]
        self.url: str = found["url"]

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
