"""Pure builders of the Kubernetes objects of one attempt (its Secret, the owner; its NetworkPolicy,
headless Service and Pods) and of a team's namespace (quota, worker identity, the launcher's Role).

Every attempt lives in its team's namespace (`team_namespace`). The per-attempt Secret is created
first and owns the rest (ownerReferences): it exists for every attempt anyway (it carries the
fencing token and the attempt's secret), lives in the same namespace as the pods and the Service,
needs no custom resource and no extra RBAC. Deleting it lets the garbage collector remove the
NetworkPolicy, the Service and every pod of the gang. The NetworkPolicy is created before the pods,
so no pod of the gang is ever open.

Names: attempt ids are free-form strings, object names are DNS labels. `attempt_key` derives a
stable DNS label (readable prefix + hash); the exact ids ride along in annotations.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.units import parse_bytes, parse_cpu
from gpuyard.launchers.base import LaunchRequest
from gpuyard.settings.kubernetes import KubernetesConfig

Manifest = dict[str, Any]

MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
ATTEMPT_LABEL = "gpuyard.io/attempt"
JOB_LABEL = "gpuyard.io/job"
RANK_LABEL = "gpuyard.io/node-rank"
ATTEMPT_ID_ANNOTATION = "gpuyard.io/attempt-id"
JOB_ID_ANNOTATION = "gpuyard.io/job-id"
ATTEMPT_NUMBER_ANNOTATION = "gpuyard.io/attempt-number"
GANG_SIZE_ANNOTATION = "gpuyard.io/gang-size"
NODE_ANNOTATION = "gpuyard.io/node"
FENCING_TOKEN_KEY = "fencing-token"
ATTEMPT_SECRET_KEY = "attempt-secret"
TMP_DIR = "/tmp"
WORKER_CONTAINER = "worker"
RENDEZVOUS_PORT_NAME = "rendezvous"
TEAM_LABEL = "gpuyard.io/team"
APP_NAME = "app.kubernetes.io/name"
NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace
PART_OF = {"app.kubernetes.io/part-of": "gpuyard"}

# Selects every object gpuyard's launcher creates (and nothing else) in its namespace.
SELECTOR = f"{MANAGED_BY}=gpuyard"

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_RESERVED_PREFIXES = ("gpuyard.io/", "app.kubernetes.io/")


# A worker pod stays in the API, whoever deletes it, until the launcher has read how its worker ended
# and the store has the attempt's outcome (as Kubernetes' Job controller keeps its pods with its
# job-tracking finalizer): a watch that missed the pod's last status and a listing that no longer
# shows the pod would otherwise lose its exit (fault campaign seed 1112: a worker that exited 0 was
# LOST, and its job ran again).
OUTCOME_FINALIZER = "gpuyard.io/outcome"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:8]


def attempt_key(attempt_id: str) -> str:
    """A DNS label (and label value) naming the attempt's objects: 'gy-<readable part>-<hash>'.

    It starts with a letter (Service names must), is at most 52 characters (room for '-<rank>'),
    and the hash of the exact id keeps ids that differ only in case or punctuation apart.
    """
    readable = re.sub(r"[^a-z0-9]+", "-", attempt_id.lower()).strip("-")[:39].rstrip("-")
    return f"gy-{readable}-{_digest(attempt_id)}" if readable else f"gy-{_digest(attempt_id)}"


def label_value(value: str) -> str:
    """`value` when Kubernetes accepts it as a label value, else a readable hashed form that it does."""
    if _LABEL_VALUE.match(value):
        return value
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:50].strip("-_.")
    return f"{readable}-{_digest(value)}" if readable else _digest(value)


def pod_name(key: str, rank: int) -> str:
    return f"{key}-{rank}"


def team_namespace(team: str, config: KubernetesConfig) -> str:
    """The namespace of a team's attempts: `<team_namespace_prefix><team>`, a DNS label."""
    name = f"{config.team_namespace_prefix}{team}"
    if len(name) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        raise ValueError(
            f"team {team!r}: namespace {name!r} is not a DNS label of at most 63 characters "
            "(shorten kubernetes.team_namespace_prefix or the team name)"
        )
    return name


def attempt_namespace(request: LaunchRequest, config: KubernetesConfig) -> str:
    return team_namespace(request.spec.team, config)


def master_addr(key: str, namespace: str, config: KubernetesConfig) -> str:
    """DNS name of rank 0 through the headless Service: stable while pod IPs change."""
    return f"{pod_name(key, 0)}.{key}.{namespace}.svc.{config.cluster_domain}"


def attempt_labels(request: LaunchRequest) -> dict[str, str]:
    return {
        MANAGED_BY: "gpuyard",
        ATTEMPT_LABEL: attempt_key(request.attempt_id),
        JOB_LABEL: label_value(request.job_id),
    }


def attempt_annotations(request: LaunchRequest) -> dict[str, str]:
    return {
        ATTEMPT_ID_ANNOTATION: request.attempt_id,
        JOB_ID_ANNOTATION: request.job_id,
        ATTEMPT_NUMBER_ANNOTATION: str(request.attempt_number),
        GANG_SIZE_ANNOTATION: str(len(request.placement.slices)),
    }


def owner_reference(owner: Manifest) -> dict[str, Any]:
    """A reference to the attempt's Secret. `blockOwnerDeletion` stays off: setting it would need
    `update` on secrets/finalizers, a right the launcher does not otherwise use."""
    meta = owner["metadata"]
    if not meta.get("uid"):
        raise ValueError(f"owner Secret {meta.get('name')!r} has no uid: create it before its dependents")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }


def _attempt_metadata(
    request: LaunchRequest, config: KubernetesConfig, component: str, owner: Manifest | None
) -> dict[str, Any]:
    """The metadata of the attempt's object that plays `component`, named by the attempt and owned by
    `owner` (its Secret; None for the Secret itself)."""
    metadata: dict[str, Any] = {
        "name": attempt_key(request.attempt_id),
        "namespace": attempt_namespace(request, config),
        "labels": {**attempt_labels(request), COMPONENT: component},
        "annotations": attempt_annotations(request),
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return metadata


def build_secret(request: LaunchRequest, config: KubernetesConfig) -> Manifest:
    """The attempt's owner object; it holds the fencing token and the attempt's secret, which never
    appear in a plain env value. Its content comes from the store, so a relaunch makes the same one."""

    def encoded(value: str) -> str:
        return base64.b64encode(value.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _attempt_metadata(request, config, "attempt", None),
        "type": "Opaque",
        "immutable": True,
        "data": {
            FENCING_TOKEN_KEY: encoded(str(request.fencing_token)),
            ATTEMPT_SECRET_KEY: encoded(request.attempt_secret),
        },
    }


def build_service(request: LaunchRequest, config: KubernetesConfig, owner: Manifest) -> Manifest:
    """Headless Service: gives rank 0 the stable name `<key>-0.<key>` even before it is ready."""
    key = attempt_key(request.attempt_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _attempt_metadata(request, config, "rendezvous", owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {ATTEMPT_LABEL: key},
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": config.master_port,
                    "targetPort": config.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def team_secret_name(team: str) -> str:
    """The Secret holding a team's secrets, one key per secret name (`env_from_secret` values)."""
    return f"gpuyard-team-{team}"


def team_pull_secret_name(team: str) -> str:
    """The team's own image pull Secret (type kubernetes.io/dockerconfigjson), for its private registry.

    Every pod refers to its team's; one that does not exist is skipped by the kubelet (with a warning
    event), so a team without a private registry needs none."""
    return f"gpuyard-pull-{team}"


def _secret_ref_env(name: str, ref: str) -> dict[str, Any]:
    secret, sep, key = ref.partition("/")
    if not sep or not secret or not key:
        raise ValueError(f"secret_env[{name!r}]: expected 'secret-name/key', got {ref!r}")
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def worker_env(request: LaunchRequest, config: KubernetesConfig, rank: int) -> list[dict[str, Any]]:
    """The job's variables, torchrun's rendezvous variables and gpuyard's; secrets only by reference:
    the platform's (config.secret_env) and the job's team's (`env_from_secret`, from its team's Secret)."""
    key = attempt_key(request.attempt_id)
    placement = request.placement
    nproc = max(len(placement.slices[rank].gpu_indices), 1)
    # Writable places on a read-only root filesystem (the job may point them elsewhere).
    platform = {"HOME": config.work_dir, "TMPDIR": TMP_DIR}
    if config.mlflow_tracking_uri:
        platform["MLFLOW_TRACKING_URI"] = config.mlflow_tracking_uri
    plain: dict[str, str] = {**platform, **request.spec.env, **request.env}  # the job's own win
    torchrun = {
        "MASTER_ADDR": master_addr(key, attempt_namespace(request, config), config),
        "MASTER_PORT": str(config.master_port),
        "NNODES": str(len(placement.slices)),
        "NODE_RANK": str(rank),
        "NPROC_PER_NODE": str(nproc),
    }
    plain.update(torchrun)
    plain.update({f"PET_{name}": value for name, value in torchrun.items()})  # torchrun reads PET_* as flags
    plain.update(
        {
            "GPUYARD_API_URL": config.api_url or request.api_url,
            "GPUYARD_ATTEMPT_ID": request.attempt_id,
            "GPUYARD_ATTEMPT_NUMBER": str(request.attempt_number),
            "GPUYARD_JOB_ID": request.job_id,
        }
    )
    if request.checkpoint_url:
        plain["GPUYARD_CHECKPOINT_URL"] = request.checkpoint_url
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in plain.items()]
    for name, secret_key in (
        ("GPUYARD_FENCING_TOKEN", FENCING_TOKEN_KEY),
        ("GPUYARD_ATTEMPT_SECRET", ATTEMPT_SECRET_KEY),
    ):
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": key, "key": secret_key}}})
    env.extend(_secret_ref_env(name, ref) for name, ref in sorted(config.secret_env.items()))
    team_secrets = team_secret_name(request.spec.team)  # the job's team's only: never another team's
    env.extend(
        {"name": var, "valueFrom": {"secretKeyRef": {"name": team_secrets, "key": secret}}}
        for var, secret in sorted(request.spec.env_from_secret.items())
    )
    return env


def worker_resources(request: LaunchRequest, config: KubernetesConfig, rank: int) -> dict[str, Any]:
    """GPUs of this node as a limit (extended resources need no request); CPU and memory per node."""
    resources = request.spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    gpus = len(request.placement.slices[rank].gpu_indices)
    if gpus:
        limits[config.gpu_resource] = str(gpus)
    if resources.cpu is not None:
        requests["cpu"] = f"{round(parse_cpu(resources.cpu) * 1000)}m"
    if resources.memory is not None:
        memory = str(parse_bytes(resources.memory))
        requests["memory"] = memory
        limits["memory"] = memory
    out: dict[str, Any] = {"limits": limits}
    if requests:
        out["requests"] = requests
    return out


def tolerations(config: KubernetesConfig) -> list[dict[str, str]]:
    out = []
    for toleration in config.gpu_tolerations:
        item = {"key": toleration.key, "operator": "Exists"}
        if toleration.effect:
            item["effect"] = toleration.effect
        out.append(item)
    return out


def _job_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The job's own labels that Kubernetes accepts (others stay in the JobSpec only)."""
    return {
        k: v
        for k, v in labels.items()
        if _LABEL_KEY.match(k) and _LABEL_VALUE.match(v) and not k.startswith(_RESERVED_PREFIXES)
    }


def build_pod(request: LaunchRequest, config: KubernetesConfig, rank: int, owner: Manifest) -> Manifest:
    """The worker pod of node rank `rank`, held to the node the scheduler chose for that rank.

    Required node affinity on the node's name (not `nodeName`) keeps kube-scheduler in the loop, so
    GPU accounting, taints and priority preemption on the node still apply.
    """
    key = attempt_key(request.attempt_id)
    node = request.placement.slices[rank].node
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": request.spec.image,
        "command": list(request.spec.command),
        "env": worker_env(request, config, rank),
        "resources": worker_resources(request, config, rank),
        "ports": [{"name": RENDEZVOUS_PORT_NAME, "containerPort": config.master_port, "protocol": "TCP"}],
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": config.read_only_root_filesystem,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},  # NCCL and DataLoader workers
            {"name": "tmp", "mountPath": TMP_DIR},
            {"name": "work", "mountPath": config.work_dir},  # HOME: .gpuyard/train, caches
        ],
    }
    if config.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": name}} for name in config.env_from_secrets]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": config.termination_grace_s,
        "serviceAccountName": config.worker_service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "hostname": pod_name(key, rank),
        "subdomain": key,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        },
        "tolerations": tolerations(config),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": config.run_as_user,
            "runAsGroup": config.run_as_user,
            "fsGroup": config.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [  # emptyDirs only: never a host path
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "work", "emptyDir": {}},
        ],
    }
    # The platform's pull secrets (registries every team may use), then the team's own.
    pull_secrets = (*config.image_pull_secrets, team_pull_secret_name(request.spec.team))
    spec["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(key, rank),
            "namespace": attempt_namespace(request, config),
            "labels": {
                **_job_labels(request.spec.labels),
                **attempt_labels(request),
                COMPONENT: "worker",
                RANK_LABEL: str(rank),
            },
            "annotations": {**attempt_annotations(request), NODE_ANNOTATION: node},
            "ownerReferences": [owner_reference(owner)],
            "finalizers": [OUTCOME_FINALIZER],
        },
        "spec": spec,
    }


def _gang(key: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {ATTEMPT_LABEL: key}}}


def _in_namespace(namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME: namespace}},
        "podSelector": {"matchLabels": dict(labels)},
    }


def build_network_policy(request: LaunchRequest, config: KubernetesConfig, owner: Manifest) -> Manifest:
    """The gang's pods accept traffic only from each other (every port: torchrun's rendezvous, then
    NCCL's or gloo's own), and reach only each other, the control plane's pods on their ports (the API
    for heartbeats, MLflow), the cluster DNS and `worker_egress_cidrs` (the object store). Nothing in
    the control plane connects to a worker, so nothing there is let in."""
    key = attempt_key(request.attempt_id)
    egress: list[dict[str, Any]] = [{"to": [_gang(key)]}]
    egress += [
        {
            "to": [_in_namespace(config.namespace, {APP_NAME: app})],
            "ports": [{"protocol": "TCP", "port": port}],
        }
        for app, port in sorted(config.control_plane_ports.items())
    ]
    egress.append(
        {
            "to": [_in_namespace(config.dns_namespace, config.dns_pod_labels)],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
    )
    if config.worker_egress_cidrs:
        egress.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in config.worker_egress_cidrs]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _attempt_metadata(request, config, "isolation", owner),
        "spec": {
            "podSelector": {"matchLabels": {ATTEMPT_LABEL: key}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [_gang(key)]}],
            "egress": egress,
        },
    }


@dataclass(frozen=True)
class AttemptObjects:
    secret: Manifest
    network_policy: Manifest
    service: Manifest
    pods: tuple[Manifest, ...]


def build_attempt(request: LaunchRequest, config: KubernetesConfig, owner: Manifest) -> AttemptObjects:
    """Everything an attempt needs, given its created owner Secret (which carries the uid)."""
    return AttemptObjects(
        secret=owner,
        network_policy=build_network_policy(request, config, owner),
        service=build_service(request, config, owner),
        pods=tuple(build_pod(request, config, rank, owner) for rank in range(len(request.placement.slices))),
    )


# ------------------------------------------------------------------------------------- team namespaces

LAUNCHER_ROLE = "gpuyard-launcher"
DEFAULT_DENY = "gpuyard-default-deny"
GPU_QUOTA = "gpuyard-gpus"

# What the launcher does in a team namespace (and the API: it reads logs), nothing more: no update,
# no patch, no wildcard; Secrets only of its own making and the team's, never listed elsewhere.
LAUNCHER_RULES: tuple[dict[str, Any], ...] = (
    # patch: a worker pod's outcome finalizer, removed once the store has its outcome
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services", "secrets"], "verbs": ["get", "list", "create", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "list", "create", "delete"],
    },
)


def team_gpu_limit(team: str, quotas: Mapping[str, TeamQuota]) -> int:
    """The most GPUs the scheduler lets `team` hold at once: its nominal quota, or, in a cohort, the
    cohort's whole nominal quota (what it may borrow while the others are idle)."""
    quota = quotas[team]
    if quota.cohort is None:
        return quota.gpu_quota
    return sum(q.gpu_quota for q in quotas.values() if q.cohort == quota.cohort)


def build_team_namespace(team: str, gpu_limit: int, config: KubernetesConfig) -> list[Manifest]:
    """A team's namespace, for a cluster admin to apply (`gpuyard kubernetes namespaces`): the Pod
    Security Standard `restricted` enforced; a ResourceQuota on GPUs, a second line behind the
    scheduler's quotas; the workers' service account (no token); a NetworkPolicy denying all traffic
    to and from any pod no attempt's policy opens; and the launcher's Role, bound to the control
    plane's service account: its only rights in the namespace."""
    namespace = team_namespace(team, config)
    labels = {**PART_OF, TEAM_LABEL: label_value(team)}

    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": dict(labels)}

    restricted = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {**labels, **restricted}},
        },
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": meta(GPU_QUOTA),
            "spec": {"hard": {f"requests.{config.gpu_resource}": str(gpu_limit)}},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(config.worker_service_account),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta(DEFAULT_DENY),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(LAUNCHER_ROLE),
            "rules": [dict(rule) for rule in LAUNCHER_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(LAUNCHER_ROLE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LAUNCHER_ROLE},
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": config.control_plane_service_account,
                    "namespace": config.namespace,
                }
            ],
        },
    ]
