"""deploy/: every manifest validates against the Kubernetes schemas, and the rights stay minimal."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import assert_valid
from gpuyard.settings import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SECRET_KEYS = dict(
    line.split("=", 1)
    for line in (DEPLOY / "secrets.env.example").read_text().splitlines()
    if line and not line.startswith("#")
)


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in documents() if doc["kind"] == kind}


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid(doc: dict[str, Any]) -> None:
    assert_valid(doc)


def test_deployments() -> None:
    deployments = by_kind("Deployment")
    assert set(deployments) == {"gpuyard-api", "gpuyard-scheduler", "gpuyard-relay", "gpuyard-mlflow"}
    for name, deployment in deployments.items():
        if name == "gpuyard-mlflow":
            continue  # not a gpuyard command (test_the_mlflow_server_...)
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert deployment["spec"]["replicas"] == 2
        assert container["args"][0] == name.removeprefix("gpuyard-")
        assert (
            pod["securityContext"]["runAsNonRoot"]
            and not container["securityContext"]["allowPrivilegeEscalation"]
        )
        assert container["resources"]["requests"] and container["resources"]["limits"]
        refs = {next(iter(ref.values()))["name"] for ref in container["envFrom"]}
        assert refs == {"gpuyard-settings", "gpuyard-secrets"}
    api = deployments["gpuyard-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service = by_kind("Service")["gpuyard-api"]
    assert service["spec"]["selector"] == deployments["gpuyard-api"]["spec"]["selector"]["matchLabels"]


def test_scheduler_and_relay_are_probed_and_scraped_on_their_settings_ports(tmp_path: Path) -> None:
    defaults = load_settings(home=tmp_path)
    ports = {"gpuyard-scheduler": defaults.scheduler_probe_port, "gpuyard-relay": defaults.relay_probe_port}
    deployments = by_kind("Deployment")
    for name, port in ports.items():
        template = deployments[name]["spec"]["template"]
        (container,) = template["spec"]["containers"]
        assert container["ports"] == [{"name": "probes", "containerPort": port}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
        assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    api = deployments["gpuyard-api"]["spec"]["template"]
    assert api["metadata"]["annotations"]["prometheus.io/port"] == "8080"


def test_the_schema_is_migrated_by_one_job_with_the_deployments_image_and_settings() -> None:
    (job,) = by_kind("Job").values()
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["command"], container["args"]) == (["gpuyard"], ["migrate"])
    api = by_kind("Deployment")["gpuyard-api"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == api["image"] and container["envFrom"] == api["envFrom"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False
    assert job["spec"]["ttlSecondsAfterFinished"]  # gone after a while: the next apply migrates again


def test_the_mlflow_server_keeps_runs_in_postgresql_and_the_workers_are_pointed_at_it() -> None:
    deployment = by_kind("Deployment")["gpuyard-mlflow"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"][1:] if "=" in arg)
    assert container["command"] == ["mlflow"] and container["args"][0] == "server"
    assert "--serve-artifacts" in container["args"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert args["backend-store-uri"] == "$(MLFLOW_BACKEND_STORE_URI)"
    assert env["MLFLOW_BACKEND_STORE_URI"] == {
        "secretKeyRef": {"name": "gpuyard-secrets", "key": "MLFLOW_BACKEND_STORE_URI"}
    }
    assert SECRET_KEYS["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg://")  # the image: psycopg 3
    config = by_kind("ConfigMap")["gpuyard-settings"]["data"]
    assert config["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    service = by_kind("Service")["gpuyard-mlflow"]
    (port,) = service["spec"]["ports"]
    url = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:{port['port']}"
    assert config["GPUYARD_KUBERNETES__MLFLOW_TRACKING_URI"] == url
    allowed = args["allowed-hosts"].split(",")
    assert url.removeprefix("http://") in allowed  # MLflow refuses other Host headers
    assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False


def test_settings() -> None:
    config = by_kind("ConfigMap")["gpuyard-settings"]["data"]
    assert config["GPUYARD_PROFILE"] == "production"
    assert config["GPUYARD_CHECKPOINT_STORE"].startswith("s3://")  # production refuses a local path
    assert {"GPUYARD_DATABASE_URL", "GPUYARD_REDIS_URL", "MLFLOW_BACKEND_STORE_URI"} <= set(SECRET_KEYS)
    assert not set(SECRET_KEYS) & set(config)  # credentials never in the ConfigMap
    assert by_kind("Secret") == {}  # the repository ships no Secret, hence no password
    assert all("<password>" in url for key, url in SECRET_KEYS.items() if "@" in url)


def rendered(directory: Path) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is needed to render deploy/ as `kubectl apply -k` would (kustomize is built in)")
    return subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)


def test_kubectl_apply_k_renders_a_platform_that_validates(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    refused = rendered(deploy)  # without the operator's credentials there is nothing to apply
    assert refused.returncode != 0 and "secrets.env" in refused.stderr
    (deploy / "secrets.env").write_text(
        (DEPLOY / "secrets.env.example").read_text().replace("<password>", "generated-by-the-operator")
    )
    done = rendered(deploy)
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    for obj in objects:
        assert_valid(obj)
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "gpuyard", obj["metadata"]["name"]
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "gpuyard-secrets" and set(secret["data"]) == set(SECRET_KEYS)
    (image,) = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["images"]
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")]
    assert {c["image"] for pod in pods for c in pod["containers"]} == {f"{image['name']}:{image['newTag']}"}
    kinds = sorted(o["kind"] for o in objects)
    assert kinds.count("Deployment") == 4 and kinds.count("Job") == 1


def test_rights_are_only_what_the_launcher_uses() -> None:
    """Cluster-wide, the control plane reads nodes and nothing else; its namespaced rights live in the
    team namespaces (manifests.LAUNCHER_RULES, checked by test_manifests and test_launcher)."""
    assert by_kind("Role") == {} and by_kind("RoleBinding") == {}  # nothing to do in its own namespace
    (cluster_role,) = by_kind("ClusterRole").values()
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = by_kind("ClusterRoleBinding").values()
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]  # never cluster-admin
    accounts = by_kind("ServiceAccount")
    assert accounts["gpuyard-worker"]["automountServiceAccountToken"] is False
    assert accounts["gpuyard-relay"]["automountServiceAccountToken"] is False
    assert {s["name"] for s in binding["subjects"]} == {"gpuyard-control-plane"}  # workers, relay: no rights


def test_the_launcher_settings_of_the_config_map_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = by_kind("ConfigMap")["gpuyard-settings"]["data"]
    for name, value in config.items():
        if name.startswith("GPUYARD_KUBERNETES__"):
            monkeypatch.setenv(name, value)
    kubernetes = load_settings(home=tmp_path).kubernetes
    assert (kubernetes.namespace, kubernetes.team_namespace_prefix) == ("gpuyard", "gpuyard-team-")
    assert kubernetes.worker_egress_cidrs == () and kubernetes.mlflow_tracking_uri is not None
