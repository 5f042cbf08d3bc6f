"""Pure builders and fates: names, environment, resources, security, isolation (NetworkPolicy, team
namespaces, RBAC), and pod statuses to outcomes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import assert_valid
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.launchers.base import LaunchRequest, Outcome
from gpuyard.launchers.kubernetes import manifests as m
from gpuyard.launchers.kubernetes.fates import PodFate, attempt_fate, pod_fate
from gpuyard.settings.kubernetes import KubernetesConfig
from test_launcher import request

from training import exit_codes

OWNER = {"metadata": {"name": "gy-x", "uid": "5f0c1b7e-0000-4000-8000-000000000001"}}


@pytest.mark.parametrize("attempt_id", ["att-1", "ATT_1", "a" * 48, "01HZX9Q2.JOB/7#2", "---"])
def test_attempt_key_is_a_dns_label_and_distinct(attempt_id: str) -> None:
    key = m.attempt_key(attempt_id)
    assert len(m.pod_name(key, 1023)) <= 63 and key[0].isalpha()
    service = m.build_service(request(attempt_id), KubernetesConfig(), OWNER)
    assert_valid(service)
    assert m.attempt_key(attempt_id.swapcase()) != key or attempt_id.swapcase() == attempt_id


def test_pod_environment_resources_and_security(config: KubernetesConfig) -> None:
    pod = m.build_pod(request(), config, 1, OWNER)
    assert_valid(pod)
    spec = pod["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    key = m.attempt_key("att-7f3a")
    assert pod["metadata"]["namespace"] == "gpuyard-team-nlp"  # the job's team's
    assert env["MASTER_ADDR"] == f"{key}-0.{key}.gpuyard-team-nlp.svc.cluster.local"
    assert (env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"], env["MASTER_PORT"]) == (
        "2",
        "1",
        "4",
        "29500",
    )
    assert env["GPUYARD_ATTEMPT_ID"] == "att-7f3a" and env["GPUYARD_JOB_ID"] == "job-42"
    assert env["GPUYARD_CHECKPOINT_URL"] == "s3://ckpt/job-42" and env["LOG_LEVEL"] == "info"
    assert env["GPUYARD_FENCING_TOKEN"] == {"secretKeyRef": {"name": key, "key": "fencing-token"}}
    assert env["GPUYARD_ATTEMPT_SECRET"] == {"secretKeyRef": {"name": key, "key": "attempt-secret"}}
    assert "secret-of-att-7f3a" not in str(pod)  # the attempt's secret by reference only
    assert env["MLFLOW_TRACKING_TOKEN"] == {"secretKeyRef": {"name": "mlflow", "key": "token"}}
    assert container["envFrom"] == [{"secretRef": {"name": "object-store"}}]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "4", "memory": str(64 * 2**30)},
        "requests": {"cpu": "16000m", "memory": str(64 * 2**30)},
    }
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    # a read-only root: the runtime writes to emptyDirs only (its HOME holds .gpuyard/train and caches)
    assert all(set(volume) == {"name", "emptyDir"} for volume in spec["volumes"])  # never a hostPath
    mounts = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/tmp": "tmp", "/var/lib/gpuyard": "work"}
    assert (env["HOME"], env["TMPDIR"]) == ("/var/lib/gpuyard", "/tmp")
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 30 and spec["serviceAccountName"] == "gpuyard-worker"
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert (spec["hostname"], spec["subdomain"]) == (f"{key}-1", key)
    assert pod["metadata"]["labels"]["project"] == "llm"  # the job's own labels ride along


def test_service_is_headless_and_selects_the_attempt(config: KubernetesConfig) -> None:
    service = m.build_service(request(), config, OWNER)
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == {m.ATTEMPT_LABEL: m.attempt_key("att-7f3a")}


def test_owner_without_uid_is_refused(config: KubernetesConfig) -> None:
    with pytest.raises(ValueError, match="has no uid"):
        m.build_pod(request(), config, 0, {"metadata": {"name": "gy-x"}})


def test_bad_secret_env_reference_names_the_variable() -> None:
    config = KubernetesConfig(secret_env={"TOKEN": "no-slash"})
    with pytest.raises(ValueError, match=r"secret_env\['TOKEN'\]"):
        m.build_pod(request(), config, 0, OWNER)


def _pod(phase: str, state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    containers = [{"name": "worker", "state": state}] if state else []
    return {"status": {"phase": phase, "containerStatuses": containers, **status}}


def _disruption(reason: str) -> dict[str, str]:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod("Pending"), PodFate(None)),
        (_pod("Running", {"running": {}}), PodFate(Outcome.RUNNING)),
        (_pod("Succeeded", {"terminated": {"exitCode": 0}}), PodFate(Outcome.SUCCEEDED, "exited 0", 0)),
        (
            _pod("Failed", {"terminated": {"exitCode": exit_codes.PREEMPTED}}),
            PodFate(Outcome.PREEMPTED, None, exit_codes.PREEMPTED),
        ),
        (
            _pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}),
            PodFate(Outcome.FAILED, "OOMKilled", 137),
        ),
        (
            _pod("Failed", {"terminated": {"exitCode": 2, "reason": "Error"}}),
            PodFate(Outcome.FAILED, "exited 2 (Error)", 2),
        ),
        (
            _pod("Failed", reason="Evicted", message="low memory"),
            PodFate(Outcome.LOST, "Evicted: low memory"),
        ),
        (_pod("Running", reason="Preempting"), PodFate(Outcome.LOST, "Preempting")),
        (_pod("Unknown"), PodFate(Outcome.LOST, "pod phase Unknown: its node stopped reporting")),
        (
            _pod("Pending", {"waiting": {"reason": "InvalidImageName"}}),
            PodFate(Outcome.FAILED, "image pull failed: InvalidImageName"),
        ),
        # Preempted or evicted on a Ready node: the kubelet stops it (SIGTERM, grace, SIGKILL); until its
        # worker ended it runs, and its exit is its fate (seed 1011: a successor ran beside it).
        (
            _pod("Running", {"running": {}}, conditions=[_disruption("PreemptionByScheduler")]),
            PodFate(Outcome.RUNNING),
        ),
        (
            _pod("Running", {"running": {}}, conditions=[_disruption("EvictionByEvictionAPI")]),
            PodFate(Outcome.RUNNING),
        ),
        (
            _pod(
                "Failed",
                {"terminated": {"exitCode": exit_codes.PREEMPTED}},
                conditions=[_disruption("EvictionByEvictionAPI")],
            ),
            PodFate(Outcome.PREEMPTED, None, exit_codes.PREEMPTED),
        ),
        (_pod("Pending", conditions=[_disruption("PreemptionByScheduler")]), PodFate(Outcome.LOST)),
        # Its pod deleted (kubectl delete): the SIGTERM or the grace period's SIGKILL is not the job's doing.
        (
            _pod("Failed", {"terminated": {"exitCode": 143}}) | {"metadata": {"deletionTimestamp": "t"}},
            PodFate(Outcome.LOST, "pod deleted (worker exited 143)", 143),
        ),
        (
            _pod("Failed", {"terminated": {"exitCode": 143, "reason": "Error"}}),
            PodFate(Outcome.FAILED, "exited 143 (Error)", 143),
        ),
        # Its node unreachable: nobody is there to stop it, nor to say it stopped.
        (
            _pod("Running", {"running": {}}, conditions=[_disruption("DeletionByTaintManager")]),
            PodFate(Outcome.LOST, "DeletionByTaintManager"),
        ),
    ],
)
def test_pod_fate(pod: dict[str, Any], expected: PodFate) -> None:
    fate = pod_fate(pod)
    assert fate.outcome is expected.outcome and fate.exit_code == expected.exit_code
    if expected.reason is not None:
        assert fate.reason == expected.reason


def test_attempt_fate_over_the_gang() -> None:
    run, done = PodFate(Outcome.RUNNING), PodFate(Outcome.SUCCEEDED, "exited 0", 0)
    failed, lost = PodFate(Outcome.FAILED, "exited 1", 1), PodFate(Outcome.LOST, "Evicted")
    assert attempt_fate({0: run}, 2).outcome is None  # rank 1 not started: not running yet
    assert attempt_fate({0: run, 1: run}, 2).outcome is Outcome.RUNNING
    assert attempt_fate({0: done, 1: run}, 2).outcome is Outcome.RUNNING
    assert attempt_fate({0: done, 1: done}, 2).outcome is Outcome.SUCCEEDED
    assert attempt_fate({0: run, 1: failed}, 2) == PodFate(Outcome.FAILED, "node rank 1: exited 1", 1)
    assert attempt_fate({0: failed, 1: lost}, 2).outcome is Outcome.LOST  # not the job's fault wins


def test_workers_log_to_the_platforms_mlflow_server_unless_the_job_names_its_own() -> None:
    """The review found worker pods logging to an MLflow SQLite file inside the pod, lost with it."""
    server = "http://gpuyard-mlflow.gpuyard.svc.cluster.local:5000"

    def tracking(config: KubernetesConfig, req: LaunchRequest) -> str | None:
        (container,) = m.build_pod(req, config, 0, OWNER)["spec"]["containers"]
        return next((e["value"] for e in container["env"] if e["name"] == "MLFLOW_TRACKING_URI"), None)

    assert tracking(KubernetesConfig(mlflow_tracking_uri=server), request()) == server
    assert tracking(KubernetesConfig(), request()) is None
    spec = request().spec.model_copy(update={"env": {"MLFLOW_TRACKING_URI": "http://team"}})
    own = replace(request(), spec=spec)
    assert tracking(KubernetesConfig(mlflow_tracking_uri=server), own) == "http://team"


def test_network_policy_opens_the_gang_to_itself_and_the_control_plane_only(config: KubernetesConfig) -> None:
    config = config.model_copy(update={"worker_egress_cidrs": ("10.20.0.0/16",)})
    policy = m.build_network_policy(request(), config, OWNER)
    assert_valid(policy)
    key = m.attempt_key("att-7f3a")
    gang = {"podSelector": {"matchLabels": {m.ATTEMPT_LABEL: key}}}
    assert policy["metadata"]["namespace"] == "gpuyard-team-nlp" and policy["metadata"]["name"] == key
    assert policy["metadata"]["ownerReferences"][0]["name"] == "gy-x"  # goes with the attempt's Secret
    spec = policy["spec"]
    assert spec["podSelector"] == gang["podSelector"] and spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"from": [gang]}]  # every port, from the gang only: NCCL/gloo pick theirs

    def control(app: str) -> dict[str, Any]:
        return {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpuyard"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": app}},
        }

    dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    assert spec["egress"] == [
        {"to": [gang]},
        {"to": [control("gpuyard-api")], "ports": [{"protocol": "TCP", "port": 8080}]},
        {"to": [control("gpuyard-mlflow")], "ports": [{"protocol": "TCP", "port": 5000}]},
        {"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]},
    ]
    # the Service's and the pods' rendezvous port is one the gang's ingress opens (all of them)
    (port,) = m.build_service(request(), config, OWNER)["spec"]["ports"]
    assert port["targetPort"] == config.master_port


def test_team_namespace_name_and_its_errors() -> None:
    assert m.team_namespace("nlp", KubernetesConfig()) == "gpuyard-team-nlp"
    assert m.team_namespace("nlp", KubernetesConfig(team_namespace_prefix="ml-")) == "ml-nlp"
    with pytest.raises(ValueError, match="not a DNS label of at most 63 characters"):
        m.team_namespace("t" * 60, KubernetesConfig())
    with pytest.raises(ValueError, match="team_namespace_prefix"):
        KubernetesConfig(team_namespace_prefix="Team_")


def test_team_gpu_limit_is_what_the_scheduler_may_let_the_team_hold() -> None:
    quotas = {
        "nlp": TeamQuota(gpu_quota=8, cohort="research"),
        "vision": TeamQuota(gpu_quota=16, cohort="research"),
        "ops": TeamQuota(gpu_quota=4),
    }
    assert m.team_gpu_limit("ops", quotas) == 4  # its nominal quota
    assert m.team_gpu_limit("nlp", quotas) == 24  # it may borrow all of its cohort's idle quota


def test_team_namespace_objects(config: KubernetesConfig) -> None:
    objects = {f"{o['kind']}/{o['metadata']['name']}": o for o in m.build_team_namespace("nlp", 24, config)}
    for obj in objects.values():
        assert_valid(obj)
    assert sorted(objects) == [
        "Namespace/gpuyard-team-nlp",
        "NetworkPolicy/gpuyard-default-deny",
        "ResourceQuota/gpuyard-gpus",
        "Role/gpuyard-launcher",
        "RoleBinding/gpuyard-launcher",
        "ServiceAccount/gpuyard-worker",
    ]
    namespace = objects["Namespace/gpuyard-team-nlp"]["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespace["labels"][m.TEAM_LABEL] == "nlp"
    assert all(
        o["metadata"].get("namespace", "gpuyard-team-nlp") == "gpuyard-team-nlp" for o in objects.values()
    )
    assert objects["ResourceQuota/gpuyard-gpus"]["spec"] == {"hard": {"requests.nvidia.com/gpu": "24"}}
    assert objects["ServiceAccount/gpuyard-worker"]["automountServiceAccountToken"] is False
    deny = objects["NetworkPolicy/gpuyard-default-deny"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}  # no rule: nothing allowed
    rules = objects["Role/gpuyard-launcher"]["rules"]
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert not [g for g in granted if "*" in g]  # no wildcard group, resource or verb
    assert {v for _, _, v in granted} <= {
        "get",
        "list",
        "watch",
        "create",
        "delete",
        "patch",
    }  # no update, escalate
    # patch only on pods (their outcome finalizer, removed once the store has the outcome): a right
    # over what the launcher may create anyway
    assert {(g, r) for g, r, v in granted if v == "patch"} == {("", "pods")}
    assert {(g, r) for g, r, _ in granted} == {
        ("", "pods"),
        ("", "pods/log"),
        ("", "services"),
        ("", "secrets"),
        ("networking.k8s.io", "networkpolicies"),
    }
    binding = objects["RoleBinding/gpuyard-launcher"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "gpuyard-launcher",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuyard-control-plane", "namespace": "gpuyard"}
    ]
