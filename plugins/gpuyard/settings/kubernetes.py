"""Settings of the Kubernetes launcher: namespaces, identities, isolation, node labels, secrets, timeouts.

Plain values, the settings object's `settings.kubernetes`; the launcher (launchers/kubernetes/) reads
them. Every field has a default that matches a cluster running the NVIDIA device plugin and GPU
feature discovery with the well-known topology labels.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from gpuyard.domain.spec import Name

_PREFIX = re.compile(r"[a-z][-a-z0-9]{0,39}")


class GpuToleration(BaseModel):
    """A taint that GPU nodes carry and worker pods must tolerate (`operator: Exists`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: StrictStr
    effect: StrictStr | None = Field(None, description="NoSchedule, PreferNoSchedule, NoExecute; None: all.")


class KubernetesConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: Name = Field(
        "gpuyard", description="Namespace of the control plane (API, scheduler, MLflow, its service account)."
    )
    team_namespace_prefix: StrictStr = Field(
        "gpuyard-team-",
        description="A team's worker pods, Services, Secrets and NetworkPolicies live in namespace "
        "<prefix><team> (manifests.team_namespace); `gpuyard kubernetes namespaces` renders them.",
    )
    control_plane_service_account: Name = Field(
        "gpuyard-control-plane", description="Service account of the scheduler and the API (in `namespace`)."
    )
    in_cluster: bool = Field(True, description="Load the pod's service account; else a kubeconfig file.")
    kubeconfig: StrictStr | None = Field(
        None,
        description="The kubeconfig file when not in the cluster; default $KUBECONFIG, else ~/.kube/config.",
    )
    context: StrictStr | None = Field(
        None,
        description="The kubeconfig's context (a file may name several clusters); default: its current one.",
    )
    worker_service_account: Name = Field(
        "gpuyard-worker", description="Service account of worker pods: it must hold no rights."
    )
    image_pull_secrets: tuple[Name, ...] = ()
    cluster_domain: StrictStr = Field("cluster.local", min_length=1)
    run_as_user: int = Field(
        10001, ge=1, description="Non-root UID (and GID) of worker containers (the image's)."
    )
    read_only_root_filesystem: bool = Field(
        True,
        description="Worker containers write only to their emptyDirs: /tmp, `work_dir` and /dev/shm.",
    )
    work_dir: StrictStr = Field(
        "/var/lib/gpuyard",
        description="An emptyDir at this path, the workers' HOME: the gpuyard image's working directory, "
        "where the runtime writes .gpuyard/train and libraries their caches.",
    )
    master_port: int = Field(29500, ge=1, le=65535, description="torchrun rendezvous port on rank 0.")
    api_url: StrictStr | None = Field(
        None, description="Control-plane URL the workers heartbeat to; default: the launch request's."
    )
    mlflow_tracking_uri: StrictStr | None = Field(
        None,
        description="MLflow tracking server the workers log to (MLFLOW_TRACKING_URI) unless the job sets "
        "its own; without it the runtime logs to a SQLite file inside the pod, lost with it.",
    )

    # Isolation: what a worker pod may reach besides its gang (NetworkPolicy per attempt).
    control_plane_ports: dict[Name, int] = Field(
        default_factory=lambda: {"gpuyard-api": 8080, "gpuyard-mlflow": 5000},
        description="app.kubernetes.io/name of a control-plane pod (in `namespace`) -> the container port "
        "workers may reach it on: the API for heartbeats, MLflow for runs and models.",
    )
    dns_namespace: Name = "kube-system"
    dns_pod_labels: dict[StrictStr, StrictStr] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"}, description="Labels of the cluster DNS pods."
    )
    worker_egress_cidrs: tuple[StrictStr, ...] = Field(
        (),
        description="Address ranges workers may also reach (the object store of checkpoints and data, a "
        "package mirror); nothing else outside the gang, the control plane and DNS.",
    )

    # Node labels: where the fleet comes from.
    gpu_resource: StrictStr = "nvidia.com/gpu"
    gpu_type_label: StrictStr = "nvidia.com/gpu.product"
    gpu_memory_label: StrictStr = Field("nvidia.com/gpu.memory", description="MiB per GPU (GFD).")
    domain_label: StrictStr = Field(
        "gpuyard.io/domain",
        description="Fast interconnect island (NVLink/InfiniBand); a node without it is a domain of its own.",
    )
    cluster_label: StrictStr = "gpuyard.io/cluster"
    site_label: StrictStr = "topology.kubernetes.io/region"
    preemptible_label: StrictStr = Field("gpuyard.io/spot", description="Value 'true' marks a spot node.")
    price_label: StrictStr = Field(
        "gpuyard.io/price-per-gpu-hour", description="Annotation (or label) with the price per GPU-hour."
    )
    default_cluster: Name = Field("default", description="Cluster name when a node has no cluster label.")
    default_site: Name = Field("default", description="Site name when a node has no site label.")
    gpu_type_aliases: dict[StrictStr, StrictStr] = Field(
        default_factory=lambda: {
            "NVIDIA-A100-SXM4-40GB": "a100",
            "NVIDIA-A100-SXM4-80GB": "a100",
            "NVIDIA-A100-80GB-PCIe": "a100",
            "NVIDIA-H100-80GB-HBM3": "h100",
            "NVIDIA-H100-PCIe": "h100",
            "NVIDIA-H200": "h200",
            "NVIDIA-L4": "l4",
        },
        description="GPU product label value -> gpuyard GPU type; other values are lowercased.",
    )

    gpu_tolerations: tuple[GpuToleration, ...] = (GpuToleration(key="nvidia.com/gpu"),)

    # Secrets: mounted into the workers by reference, never copied into plain env values. A pod reads
    # Secrets of its own namespace only: these must exist in every team namespace.
    env_from_secrets: tuple[Name, ...] = Field(
        (), description="Secrets whose every key becomes an environment variable (envFrom)."
    )
    secret_env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict,
        description="Variable name -> 'secret-name/key', read with secretKeyRef (e.g. object store keys).",
    )

    termination_grace_s: int = Field(60, ge=0, description="Time a worker has to checkpoint after SIGTERM.")
    start_timeout_s: float = Field(
        900.0,
        gt=0,
        description="Time an attempt's pods may take to start (image pull, container creation) while "
        "they make progress; past it the attempt FAILS with the reason. A pod not bound to a node is "
        "left to the lease.",
    )
    watch_timeout_s: int = Field(300, ge=1, description="Server-side watch timeout; the watch then resumes.")
    request_timeout_s: float = Field(30.0, gt=0, description="Client-side timeout of one API request.")

    @field_validator("team_namespace_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PREFIX.fullmatch(value):
            raise ValueError(
                "expected the start of a DNS label (lowercase letters, digits and '-', a letter first, "
                f"at most 40 characters), got {value!r}"
            )
        return value
