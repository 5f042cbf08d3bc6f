"""KubernetesLauncher against kmock's Kubernetes emulator, over HTTP, through the real client.

The emulator plays the API server; the tests play kubelet, node controller and scheduler by
writing pod statuses and nodes through the API. Nothing of the launcher is mocked.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import kmock
import pytest
from conftest import Cluster, assert_valid
from gpuyard.domain.placement import NodeSlice, Placement
from gpuyard.domain.spec import JobSpec
from gpuyard.launchers.base import LaunchRequest, Outcome, WorkerReport
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.launchers.kubernetes.launcher import KubernetesLauncher, LaunchError
from gpuyard.settings.kubernetes import KubernetesConfig
from kmock import action
from local_cluster.apiserver import expired_status
from servers import wait_until

from training import exit_codes

SPEC = JobSpec(
    name="llm",
    team="nlp",
    image="registry.example/llm:1.4",
    command=("torchrun", "train.py"),
    env={"LOG_LEVEL": "info"},
    resources={"gpus": 8, "nodes": 2, "cpu": 16, "memory": "64Gi"},
    labels={"project": "llm"},
)


TEAM_NS = "gpuyard-team-nlp"
ATTEMPT_PLURALS = ("secrets", "networkpolicies", "services", "pods")


def request(
    attempt_id: str = "att-7f3a", nodes: tuple[str, ...] = ("gpu-a", "gpu-b"), spec: JobSpec = SPEC
) -> LaunchRequest:
    return LaunchRequest(
        attempt_id=attempt_id,
        job_id="job-42",
        attempt_number=2,
        fencing_token=918273,
        attempt_secret=f"secret-of-{attempt_id}",
        spec=spec,
        placement=Placement("eu-west", "c1", "rack-1", tuple(NodeSlice(n, (0, 1, 2, 3)) for n in nodes)),
        api_url="http://gpuyard-api.gpuyard.svc:8080",
        checkpoint_url="s3://ckpt/job-42",
    )


def pod_names(attempt_id: str, gang: int = 2) -> list[str]:
    key = m.attempt_key(attempt_id)
    return [m.pod_name(key, rank) for rank in range(gang)]


def container(state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    return {
        "name": "worker",
        "image": SPEC.image,
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state,
    }


def running() -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [container({"running": {"startedAt": "2026-11-30T10:00:00Z"}}, ready=True)],
    }


def terminated(code: int, reason: str = "Error", phase: str | None = None) -> dict[str, Any]:
    return {
        "phase": phase or ("Succeeded" if code == 0 else "Failed"),
        "containerStatuses": [container({"terminated": {"exitCode": code, "reason": reason}})],
    }


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "containerStatuses": [container({"waiting": {"reason": reason, "message": message}})],
    }


def collect(
    launcher: KubernetesLauncher, until: Callable[[list[WorkerReport]], bool], timeout: float = 8.0
) -> list[WorkerReport]:
    """observe() until the reports so far satisfy `until` (the watch is asynchronous), acknowledging
    each as the scheduler does once the store has it."""
    reports: list[WorkerReport] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for report in launcher.observe():
            launcher.acknowledge(report)
            reports.append(report)
        if until(reports):
            return reports
        time.sleep(0.05)
    raise AssertionError(f"timed out; reports so far: {reports}")


def outcome(reports: list[WorkerReport], attempt_id: str) -> list[Outcome]:
    return [r.outcome for r in reports if r.attempt_id == attempt_id]


def ended(attempt_id: str) -> Callable[[list[WorkerReport]], bool]:
    return lambda reports: any(
        r.attempt_id == attempt_id and r.outcome is not Outcome.RUNNING for r in reports
    )


def ours(cluster: Cluster, plural: str) -> list[dict[str, Any]]:
    """The launcher's objects of this kind (not the team namespace's own default-deny policy)."""
    return [
        o for o in cluster.objects(plural) if o["metadata"].get("labels", {}).get(m.MANAGED_BY) == "gpuyard"
    ]


def created(cluster: Cluster) -> list[Any]:
    """The launcher's create requests (not those of the team namespace set up by the fixture)."""
    return [
        r
        for r in list(cluster.emulator)
        if r.action == action.CREATE
        and r.resource.plural in ATTEMPT_PLURALS
        and r.data["metadata"].get("labels", {}).get(m.MANAGED_BY) == "gpuyard"
    ]


@pytest.fixture
def nodes(cluster: Cluster, config: KubernetesConfig) -> None:
    cluster.add_node("gpu-a")
    cluster.add_node("gpu-b")
    cluster.apply(m.build_team_namespace("nlp", 16, config))  # what `gpuyard kubernetes namespaces` prints


def teams() -> list[str]:
    return ["nlp", "vision"]  # the store's teams: vision has no namespace in the cluster


@pytest.fixture
def launcher(cluster: Cluster, config: KubernetesConfig, nodes: None) -> Iterator[KubernetesLauncher]:
    with KubernetesLauncher(config, cluster.api, teams=teams, backoff_s=0.05) as launcher:
        yield launcher


def start_gang(cluster: Cluster, launcher: KubernetesLauncher, attempt_id: str = "att-7f3a") -> list[str]:
    launcher.launch(request(attempt_id))
    names = pod_names(attempt_id)
    for name in names:
        cluster.set_pod_status(name, running())
    reports = collect(launcher, lambda rs: Outcome.RUNNING in outcome(rs, attempt_id))
    assert outcome(reports, attempt_id) == [Outcome.RUNNING]
    return names


def test_launch_creates_valid_owned_objects(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    launcher.launch(request())
    secrets, services, pods = cluster.objects("secrets"), cluster.objects("services"), cluster.pods()
    policies = ours(cluster, "networkpolicies")
    assert len(secrets) == 1 and len(services) == 1 and len(pods) == 2 and len(policies) == 1
    for obj in [*secrets, *policies, *services, *pods]:
        assert_valid(obj)
        assert obj["metadata"]["namespace"] == TEAM_NS  # the team's namespace, not the control plane's
    owner = secrets[0]["metadata"]
    for obj in [*policies, *services, *pods]:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("Secret", owner["name"], owner["uid"])
    # the fencing token and the attempt's secret are only in the Secret, never in a pod's plain env
    data = {k: base64.b64decode(v).decode() for k, v in secrets[0]["data"].items()}
    assert data == {"fencing-token": "918273", "attempt-secret": "secret-of-att-7f3a"}
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert "918273" not in str(pod) and "secret-of-att-7f3a" not in str(pod)
        refs = {e["name"]: e.get("valueFrom") for e in container["env"] if e["name"].startswith("GPUYARD_")}
        assert refs["GPUYARD_FENCING_TOKEN"] == {
            "secretKeyRef": {"name": owner["name"], "key": "fencing-token"}
        }
        assert refs["GPUYARD_ATTEMPT_SECRET"] == {
            "secretKeyRef": {"name": owner["name"], "key": "attempt-secret"}
        }
    nodes = sorted(
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchFields"][0]["values"][0]
        for p in pods
    )
    assert nodes == ["gpu-a", "gpu-b"]
    # the owner first, then the gang's NetworkPolicy: no pod of the gang exists before it is isolated
    plurals = [r.resource.plural for r in created(cluster)]
    assert plurals == ["secrets", "networkpolicies", "services", "pods", "pods"]
    (policy,) = policies
    gang = {"podSelector": {"matchLabels": {m.ATTEMPT_LABEL: m.attempt_key("att-7f3a")}}}
    assert policy["spec"]["podSelector"] == gang["podSelector"]
    assert policy["spec"]["ingress"] == [{"from": [gang]}]


def test_a_team_without_its_namespace_is_refused_with_the_fix(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    vision = SPEC.model_copy(update={"team": "vision"})
    with pytest.raises(LaunchError) as refused:
        launcher.launch(request("att-v", spec=vision))
    assert str(refused.value) == (
        "creating secret gpuyard-team-vision/" + m.attempt_key("att-v") + ": namespace gpuyard-team-vision "
        "not found (404): a cluster admin creates it with "
        "`gpuyard kubernetes namespaces --team vision | kubectl apply -f -`"
    )
    assert [r.resource.plural for r in created(cluster)] == ["secrets"]  # the refused one, nothing after it
    assert cluster.pods() == []


def caught_up(cluster: Cluster, launcher: KubernetesLauncher, marker: str) -> list[WorkerReport]:
    """The reports observed until the launcher has seen every pod change made before this call: a
    marker gang started now runs once its pods' events, which the watch delivers after the earlier
    ones of the namespace, are applied."""
    launcher.launch(request(marker))
    for name in pod_names(marker):
        cluster.set_pod_status(name, running())
    return collect(launcher, lambda rs: Outcome.RUNNING in outcome(rs, marker))


def test_watch_turns_phases_into_reports(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    names = start_gang(cluster, launcher)
    cluster.set_pod_status(names[0], terminated(exit_codes.SUCCESS))
    assert outcome(caught_up(cluster, launcher, "att-mark1"), "att-7f3a") == []  # rank 1 runs: no verdict
    cluster.set_pod_status(names[1], terminated(exit_codes.SUCCESS))
    reports = collect(launcher, ended("att-7f3a"))
    (report,) = reports
    assert (report.outcome, report.exit_code) == (Outcome.SUCCEEDED, exit_codes.SUCCESS)
    assert outcome(caught_up(cluster, launcher, "att-mark2"), "att-7f3a") == []  # reported once


def test_preempted_exit_code_is_preempted(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    names = start_gang(cluster, launcher)
    for name in names:
        cluster.set_pod_status(name, terminated(exit_codes.PREEMPTED, phase="Failed"))
    (report,) = collect(launcher, ended("att-7f3a"))
    assert (report.outcome, report.exit_code) == (Outcome.PREEMPTED, exit_codes.PREEMPTED)


def test_one_failed_rank_ends_the_gang_and_stops_the_others(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    names = start_gang(cluster, launcher)
    cluster.set_pod_status(names[1], terminated(3))
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.FAILED and report.exit_code == 3
    assert report.reason is not None and report.reason.startswith("node rank 1: exited 3")
    deletes = [r for r in list(cluster.emulator) if r.action == action.DELETE and r.resource.plural == "pods"]
    assert deletes[0].name == names[0]  # the running rank is stopped first, with its grace period
    assert deletes[0].params["gracePeriodSeconds"] == "30"
    # then, the store having the ending, the pods go (their outcome read, the launcher lets them go)
    wait_until(
        lambda: launcher.observe() is not None and cluster.pods() == [], timeout_s=8, what="the pods to go"
    )


def test_oom_killed_fails_with_reason(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    names = start_gang(cluster, launcher)
    cluster.set_pod_status(names[0], terminated(137, reason="OOMKilled"))
    (report,) = collect(launcher, ended("att-7f3a"))
    assert (report.outcome, report.reason, report.exit_code) == (
        Outcome.FAILED,
        "node rank 0: OOMKilled",
        137,
    )


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_image_pull_errors_fail_with_a_clear_reason(
    cluster: Cluster, launcher: KubernetesLauncher, reason: str
) -> None:
    launcher.launch(request())
    name = pod_names("att-7f3a")[0]
    cluster.set_pod_status(name, waiting(reason, 'pull "registry.example/llm:1.4": not found'))
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.FAILED
    assert (
        report.reason
        == f'node rank 0: image pull failed: {reason}: pull "registry.example/llm:1.4": not found'
    )
    assert cluster.pods() == []  # the waiting rank 1 was stopped, and every object went with the ending


def test_evicted_pod_is_lost(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    names = start_gang(cluster, launcher)
    cluster.set_pod_status(
        names[0],
        {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: ephemeral-storage.",
        },
    )
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.LOST
    assert report.reason == "node rank 0: Evicted: The node was low on resource: ephemeral-storage."


def test_a_pod_evicted_on_a_ready_node_runs_until_its_worker_stopped(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """The eviction's notice (DisruptionTarget; the kubelet sends SIGTERM) ends nothing: the attempt runs
    until its workers exit, so no successor starts beside them (fault campaign seed 1011)."""
    names = start_gang(cluster, launcher)
    notice = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
    cluster.set_pod_status(names[0], running() | {"conditions": notice})
    reports: list[WorkerReport] = []

    def noticed() -> bool:  # the launcher has applied the notice to its view of the pod
        reports.extend(launcher.observe())
        return any(
            pod["metadata"]["name"] == names[0] and (pod.get("status") or {}).get("conditions") == notice
            for pod in launcher._pods.values()
        )

    wait_until(noticed, timeout_s=8, what="the launcher to see the eviction's notice")
    assert [r.outcome for r in reports if r.outcome is not Outcome.RUNNING] == []
    for name in names:  # the checkpoint saved on the notice, both ranks stop
        cluster.set_pod_status(name, terminated(exit_codes.PREEMPTED) | {"conditions": notice})
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.PREEMPTED and report.disrupted, report


def test_disruption_by_taint_manager_is_lost_even_with_a_crash_exit(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    names = start_gang(cluster, launcher)
    status = terminated(143)
    status["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    ]
    cluster.set_pod_status(names[0], status)
    cluster.set_pod_status(
        names[1], terminated(exit_codes.FAILURE)
    )  # its peer's collectives failed: not the job's fault
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.LOST and "DeletionByTaintManager" in (report.reason or "")


def test_node_that_disappears_loses_the_attempt(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    start_gang(cluster, launcher)
    cluster.api.delete_node("gpu-b")
    (report,) = collect(launcher, ended("att-7f3a"))
    assert (report.outcome, report.reason) == (
        Outcome.LOST,
        "node rank 1: node gpu-b was removed from the cluster",
    )


def test_pod_deleted_behind_our_back_is_lost_once_its_worker_ended(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    names = start_gang(cluster, launcher)
    cluster.api.delete_namespaced_pod(names[0], TEAM_NS)  # kubectl delete: SIGTERM, the grace period
    (pod,) = [p for p in cluster.pods() if p["metadata"]["name"] == names[0]]
    assert pod["metadata"].get("deletionTimestamp")  # held (the outcome finalizer) for its exit
    cluster.set_pod_status(names[0], terminated(128 + 15))
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.LOST and "pod deleted (worker exited 143)" in (report.reason or "")


def test_410_gone_relists_and_resumes(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    names = start_gang(cluster, launcher)
    relists_before = launcher.relists
    expired = {"type": "ERROR", "object": expired_status("1003", "2001")}

    def history_lost() -> Iterator[dict[str, Any]]:
        # While the launcher is between watches, both pods finish; no watch event says so.
        for name in names:
            cluster.emulator.patch_silently("pods", name, {"status": terminated(exit_codes.SUCCESS)})
        yield expired

    cluster.emulator["watch pods"] << history_lost()  # the next pod watch (after a timeout) gets 410
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.SUCCEEDED  # only a fresh listing could have shown it
    assert launcher.relists > relists_before  # (a watch restarted after other changes re-lists too)
    pod_calls = [r for r in list(cluster.emulator) if r.resource is not None and r.resource.plural == "pods"]
    after_gone = pod_calls[[r.params.get("watch") for r in pod_calls].index("True", 1) :]
    assert any(r.action == action.LIST for r in after_gone), "no re-list after 410 Gone"


def test_a_pod_deleted_between_two_watches_is_seen_gone(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """Seed 1101 of the fault suite on the emulated cluster: the API server's link was cut while a
    cancelled pod stopped and was deleted; the watch, resumed from the launcher's version, streamed the
    pods there were and not the one gone, and the launcher kept its attempt Running (renewing its lease)
    98 s, until a new leader found no pod. A watch from before a change it missed now expires (410),
    and the listing that follows shows the pods gone."""
    names = start_gang(cluster, launcher)

    def deleted_meanwhile() -> Iterator[dict[str, Any]]:
        # While the launcher is between watches, the pods are removed, finalizers and all (a pod
        # garbage collector, an operator): no watch event says so.
        for name in names:
            cluster.emulator.delete_silently("pods", name, force=True)
        yield from ()  # this watch ends; the launcher's next one starts from its version

    cluster.emulator["watch pods"] << deleted_meanwhile()
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.LOST and "deleted before it ended" in (report.reason or "")


def test_conflict_on_create_adopts_after_restart(
    cluster: Cluster, config: KubernetesConfig, launcher: KubernetesLauncher
) -> None:
    launcher.launch(request())
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods()}
    launcher.close()
    with KubernetesLauncher(config, cluster.api, backoff_s=0.05) as restarted:
        restarted.launch(request())  # same attempt again: every create meets 409 and adopts
        assert len(created(cluster)) == 10  # 5 created, then 5 conflicts
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods()} == before
        for name in pod_names("att-7f3a"):
            cluster.set_pod_status(name, running())
        assert outcome(collect(restarted, lambda rs: bool(rs)), "att-7f3a") == [Outcome.RUNNING]


def test_conflict_with_another_attempts_object_is_refused(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    launcher.launch(request())
    secret = cluster.objects("secrets")[0]
    cluster.emulator.patch_silently(
        "secrets",
        secret["metadata"]["name"],
        {"metadata": {"annotations": {m.ATTEMPT_ID_ANNOTATION: "other"}}},
    )
    with pytest.raises(LaunchError, match="belongs to attempt 'other'"):
        launcher.launch(request())


def test_cancel_deletes_with_grace_reads_the_workers_exits_then_lets_the_pods_go(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """A cancel deletes the pods with its grace period; they stay (Terminating, the launcher's
    outcome finalizer) until their workers' exits are read and the store has the outcome."""
    names = start_gang(cluster, launcher)
    launcher.cancel("att-7f3a", grace_s=45)
    deletes = [r for r in list(cluster.emulator) if r.action == action.DELETE and r.resource.plural == "pods"]
    assert [r.params["gracePeriodSeconds"] for r in deletes] == ["45", "45"]
    assert all(p["metadata"].get("deletionTimestamp") for p in cluster.pods())  # marked, held for their exits
    for name in names:  # the kubelet's SIGTERM: each worker ends
        cluster.set_pod_status(name, terminated(128 + 15))
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.LOST and report.disrupted
    assert (report.reason or "").startswith("node rank 0: pod deleted (worker exited 143)")
    gone = lambda: launcher.observe() is not None and not any(ours(cluster, p) for p in ATTEMPT_PLURALS)  # noqa: E731
    wait_until(gone, timeout_s=8, what="the attempt's objects to go")


def test_a_pod_deleted_before_its_worker_started_ends_once_its_node_lets_it_go(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """Bounded campaign seed 724163: an attempt preempted while its image was still pulling; its pods,
    held by the outcome finalizer, would never report an exit: the attempt stayed LAUNCHING. A
    deleted pod whose worker never started, and that only the launcher still holds, has ended."""
    launcher.launch(request())  # its pods are never started: no status at all
    launcher.cancel("att-7f3a", grace_s=30)
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.LOST and (report.reason or "").startswith("node rank 0: cancelled")
    gone = lambda: launcher.observe() is not None and not any(ours(cluster, p) for p in ATTEMPT_PLURALS)  # noqa: E731
    wait_until(gone, timeout_s=8, what="the attempt's objects to go")


def test_a_workers_exit_survives_its_pods_deletion_between_two_watches(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """Seed 1112 of the fault suite on the emulated cluster: a preemption deleted a pod as its worker
    exited 0; the launcher's watch missed that last status, and its listing after a 410 no longer
    showed the pod: LOST, and a finished job ran again. The launcher's outcome finalizer keeps a
    deleted pod until its exit is read: the listing shows it, ended."""
    names = start_gang(cluster, launcher)

    def exited_and_deleted_meanwhile() -> Iterator[dict[str, Any]]:
        for name in names:  # while the launcher is between watches: no event says so
            cluster.emulator.patch_silently("pods", name, {"status": terminated(exit_codes.SUCCESS)})
            cluster.emulator.delete_silently("pods", name)
        yield from ()

    cluster.emulator["watch pods"] << exited_and_deleted_meanwhile()
    (report,) = collect(launcher, ended("att-7f3a"))
    assert (report.outcome, report.exit_code) == (Outcome.SUCCEEDED, exit_codes.SUCCESS)


def test_a_graceful_stop_keeps_the_attempts_network_until_its_pods_are_gone(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """The preemption checkpoint is written during the grace period: the policy that lets the pods
    reach the store, the Service of their gang and the Secret stay until the last pod is gone."""
    names = start_gang(cluster, launcher)
    for name in names:
        cluster.hold_termination(name)
    key = m.attempt_key("att-7f3a")

    def left() -> dict[str, list[str]]:
        return {
            plural: sorted(o["metadata"]["name"] for o in ours(cluster, plural)) for plural in ATTEMPT_PLURALS
        }

    launcher.cancel("att-7f3a", grace_s=45)
    launcher.observe()  # a pass during the grace period deletes nothing more
    assert all(p["metadata"].get("deletionTimestamp") for p in cluster.pods())  # SIGTERM sent
    assert left() == {"pods": names, "networkpolicies": [key], "services": [key], "secrets": [key]}
    cluster.set_pod_status(names[0], terminated(exit_codes.PREEMPTED, phase="Failed"))
    cluster.finish_termination(names[0])  # its checkpoint written, it stopped; rank 1 still saves
    launcher.observe()
    assert left() == {"pods": names, "networkpolicies": [key], "services": [key], "secrets": [key]}
    cluster.set_pod_status(names[1], terminated(exit_codes.PREEMPTED, phase="Failed"))
    cluster.finish_termination(names[1])
    (report,) = collect(launcher, ended("att-7f3a"))
    assert report.outcome is Outcome.PREEMPTED  # both saved and exited 75: read before the pods went
    wait_until(lambda: launcher.observe() is not None and not any(left().values()), what="the objects to go")
    deletes = [r for r in list(cluster.emulator) if r.action == action.DELETE and r.resource.plural == "pods"]
    assert [r.params["gracePeriodSeconds"] for r in deletes] == ["45", "45"]  # never shortened


def test_reconcile_after_restart(
    cluster: Cluster, config: KubernetesConfig, launcher: KubernetesLauncher
) -> None:
    live, orphan, vanished, half = (
        request("att-live"),
        request("att-orphan"),
        request("att-vanished"),
        request("att-half"),
    )
    for req in (live, orphan, vanished, half):
        launcher.launch(req)
    launcher.close()  # the scheduler dies; meanwhile pods vanish, finalizers and all (a pod GC)
    for name in pod_names("att-vanished"):
        cluster.emulator.delete_silently("pods", name, force=True)
    cluster.emulator.delete_silently("pods", pod_names("att-half")[1], force=True)

    with KubernetesLauncher(config, cluster.api, teams=teams, backoff_s=0.05) as restarted:
        launched = (replace(r, launched_before=True) for r in (live, vanished, half))
        reports = restarted.reconcile({r.attempt_id: r for r in launched})
        for report in reports:
            restarted.acknowledge(report)  # the scheduler does, once the store has them
        by_attempt = {r.attempt_id: r for r in reports}
        assert set(by_attempt) == {"att-vanished", "att-half"}
        assert by_attempt["att-vanished"].outcome is Outcome.LOST
        assert by_attempt["att-vanished"].reason == "no worker pods found after a restart"
        assert by_attempt["att-half"].outcome is Outcome.LOST and "[0] of 2" in (
            by_attempt["att-half"].reason or ""
        )
        # only the live attempt's objects remain: orphans and the broken gangs are cleaned up
        assert sorted(p["metadata"]["name"] for p in cluster.pods()) == pod_names("att-live")
        assert [s["metadata"]["name"] for s in cluster.objects("secrets")] == [m.attempt_key("att-live")]
        assert [s["metadata"]["name"] for s in cluster.objects("services")] == [m.attempt_key("att-live")]
        assert [p["metadata"]["name"] for p in ours(cluster, "networkpolicies")] == [
            m.attempt_key("att-live")
        ]
        # the adopted attempt is observed as before
        for name in pod_names("att-live"):
            cluster.set_pod_status(name, terminated(exit_codes.SUCCESS))
        (report,) = collect(restarted, ended("att-live"))
        assert (report.attempt_id, report.outcome) == ("att-live", Outcome.SUCCEEDED)


def test_list_requests_use_the_label_selector(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    launcher.reconcile({})
    lists = [r for r in list(cluster.emulator) if r.action == action.LIST and r.resource.plural != "nodes"]
    assert {(r.namespace, r.resource.plural) for r in lists} == {
        (ns, plural) for ns in (TEAM_NS, "gpuyard-team-vision") for plural in ATTEMPT_PLURALS
    }  # the store's teams' namespaces only: nothing cluster-wide but nodes
    assert all(r.params.get("labelSelector") == "app.kubernetes.io/managed-by=gpuyard" for r in lists)


def test_a_restart_cleans_up_the_namespace_of_a_team_with_nothing_live(
    cluster: Cluster, config: KubernetesConfig, launcher: KubernetesLauncher
) -> None:
    launcher.launch(request("att-gone"))
    launcher.close()
    with KubernetesLauncher(config, cluster.api, teams=teams, backoff_s=0.05) as restarted:
        assert restarted.reconcile({}) == []  # no live attempt names nlp: its namespace comes from `teams`
    assert not any(ours(cluster, plural) for plural in ATTEMPT_PLURALS)


def test_cancel_after_a_restart_finds_the_attempts_namespace(
    cluster: Cluster, config: KubernetesConfig, launcher: KubernetesLauncher
) -> None:
    launcher.launch(request())
    launcher.close()
    with KubernetesLauncher(config, cluster.api, teams=teams, backoff_s=0.05) as restarted:
        restarted.cancel("att-7f3a", grace_s=0)
    assert not any(ours(cluster, plural) for plural in ATTEMPT_PLURALS)


def test_foreign_pods_are_left_alone(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    cluster.api.create_namespaced_pod(
        TEAM_NS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "someone-else", "namespace": TEAM_NS},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    assert launcher.reconcile({}) == []
    assert [p["metadata"]["name"] for p in cluster.pods()] == ["someone-else"]


ENDINGS: dict[str, tuple[Callable[[Cluster, list[str]], Any], Outcome]] = {
    "succeeded": (
        lambda c, names: [c.set_pod_status(n, terminated(exit_codes.SUCCESS)) for n in names],
        Outcome.SUCCEEDED,
    ),
    "failed": (lambda c, names: c.set_pod_status(names[1], terminated(3)), Outcome.FAILED),
    "preempted": (
        lambda c, names: [
            c.set_pod_status(n, terminated(exit_codes.PREEMPTED, phase="Failed")) for n in names
        ],
        Outcome.PREEMPTED,
    ),
    "evicted": (
        lambda c, names: c.set_pod_status(names[0], {"phase": "Failed", "reason": "Evicted"}),
        Outcome.LOST,
    ),
    "node-removed": (lambda c, names: c.api.delete_node("gpu-b"), Outcome.LOST),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_an_ended_attempt_leaves_no_object_behind(
    cluster: Cluster, launcher: KubernetesLauncher, ending: str
) -> None:
    """The review counted the Secrets and Services left after attempts ended: each attempt left its two."""
    end, expected = ENDINGS[ending]
    cluster.add_node("gpu-c")
    cluster.add_node("gpu-d")
    launcher.launch(request("att-other", ("gpu-c", "gpu-d")))  # a neighbour that keeps running
    names = start_gang(cluster, launcher)
    counted = {plural: len(ours(cluster, plural)) for plural in ATTEMPT_PLURALS}
    assert counted == {"secrets": 2, "networkpolicies": 2, "services": 2, "pods": 4}
    end(cluster, names)
    deadline = time.monotonic() + 8
    while not (reports := [r for r in launcher.observe() if r.attempt_id == "att-7f3a"]):
        assert time.monotonic() < deadline, "the attempt never ended"
        time.sleep(0.05)
    (report,) = reports
    assert report.outcome is expected
    assert len(cluster.objects("secrets")) == 2  # kept until the store has the ending
    launcher.acknowledge(report)
    key = m.attempt_key("att-other")
    for plural in ("secrets", "networkpolicies", "services"):
        assert [s["metadata"]["name"] for s in ours(cluster, plural)] == [key], plural
    assert sorted(p["metadata"]["name"] for p in cluster.pods()) == pod_names("att-other")


def test_logs_of_every_rank(cluster: Cluster, launcher: KubernetesLauncher) -> None:
    launcher.launch(request())
    names = pod_names("att-7f3a")
    (
        cluster.emulator[f"get /api/v1/namespaces/{TEAM_NS}/pods/{names[0]}/log"]
        << b"step 1 loss 2.0\nstep 2 loss 1.5\n"
    )
    cluster.emulator[f"get /api/v1/namespaces/{TEAM_NS}/pods/{names[1]}/log"] << b"rank 1 ready\n"
    assert list(launcher.logs("att-7f3a")) == [
        "[node-rank 0] step 1 loss 2.0\n",
        "[node-rank 0] step 2 loss 1.5\n",
        "[node-rank 1] rank 1 ready\n",
    ]
    followed = sorted(launcher.logs("att-7f3a", follow=True))
    assert followed == [
        "[node-rank 0] step 1 loss 2.0\n",
        "[node-rank 0] step 2 loss 1.5\n",
        "[node-rank 1] rank 1 ready\n",
    ]
    follows = [
        r for r in list(cluster.emulator) if r.subresource == "log" and r.params.get("follow") == "True"
    ]
    assert len(follows) == 2


VERBS = {
    action.LIST: "list",
    action.WATCH: "watch",
    action.FETCH: "get",
    action.CREATE: "create",
    action.DELETE: "delete",
    action.UPDATE: "patch",
}


def test_every_request_of_the_launcher_is_granted_by_its_rules(
    cluster: Cluster, config: KubernetesConfig, launcher: KubernetesLauncher
) -> None:
    """A whole life (launch, run, logs, a failure, cleanup, a cancel of an unknown attempt, a restart's
    reconcile): every request is in the team namespace Role (manifests.LAUNCHER_RULES) or is a read of
    nodes, the one cluster-wide right deploy/rbac.yaml grants."""
    first = len(list(cluster.emulator))
    names = start_gang(cluster, launcher)
    for name in names:
        cluster.emulator[f"get /api/v1/namespaces/{TEAM_NS}/pods/{name}/log"] << b"step 1\n"
    assert list(launcher.logs("att-7f3a")) == ["[node-rank 0] step 1\n", "[node-rank 1] step 1\n"]
    cluster.set_pod_status(names[1], terminated(3))
    collect(launcher, ended("att-7f3a"))
    launcher.cancel("att-unknown", grace_s=0)
    with KubernetesLauncher(config, cluster.api, teams=teams, backoff_s=0.05) as restarted:
        restarted.reconcile({})
    granted = {
        (group, resource, verb)
        for rule in m.LAUNCHER_RULES
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    made = [r for r in list(cluster.emulator)[first:] if r.subresource != "status"]  # not the kubelet's
    assert {r.resource.plural for r in made} >= {"pods", "secrets", "services", "networkpolicies", "nodes"}
    for r in made:
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        verb = VERBS[r.action]
        if r.namespace is None:
            assert (resource, verb) in {("nodes", "list"), ("nodes", "watch")}, (resource, verb)
        else:
            assert r.namespace in (TEAM_NS, "gpuyard-team-vision"), r.namespace
            assert (r.resource.group, resource, verb) in granted, (r.resource.group, resource, verb)


def test_a_pod_the_quota_refuses_fails_the_launch_naming_the_quota(
    cluster: Cluster, launcher: KubernetesLauncher
) -> None:
    """The team namespace's ResourceQuota, the second line behind the scheduler's quotas, speaks
    through the launch error (and so through the attempt's reason)."""
    said = "exceeded quota: gpuyard-gpus, requested: requests.nvidia.com/gpu=4, used: 16, limited: 16"
    refusal = kmock.KubernetesError(status=403, reason="Forbidden", message=said)
    cluster.emulator[f"post /api/v1/namespaces/{TEAM_NS}/pods"] << refusal
    with pytest.raises(LaunchError) as refused:
        launcher.launch(request())
    assert str(refused.value) == (f"creating pod {TEAM_NS}/{pod_names('att-7f3a')[0]}: 403 Forbidden: {said}")
