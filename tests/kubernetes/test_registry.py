"""The launcher registry: `launcher: kubernetes` builds the Kubernetes launcher (the review saw
`gpuyard scheduler` refuse it and exit), and its fleet source reads the Nodes API again on each call,
so cordoned, NotReady and removed nodes leave the fleet."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import NAMESPACE, Cluster
from gpuyard.clock import utcnow
from gpuyard.domain.fleet import Fleet
from gpuyard.launchers.kubernetes.launcher import KubernetesLauncher
from gpuyard.launchers.registry import LAUNCHERS
from gpuyard.services import build_launcher, check_names, fleet_source, launcher_kind
from gpuyard.settings import SettingsError, load_settings

NO_FLEET = lambda: Fleet(nodes=())  # noqa: E731  (what a launcher is built with where no fleet matters)


@pytest.fixture
def kubeconfig(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubeconfig file pointing at the API double, as an operator's ~/.kube/config would."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))


def test_every_launcher_is_one_entry_with_its_fleet_and_logs() -> None:
    assert set(LAUNCHERS) == {"local", "kubernetes"}
    assert all(entry.build and entry.fleet and entry.logs for entry in LAUNCHERS.values())


def test_the_kubernetes_launcher_is_built_and_its_fleet_follows_the_nodes_api(
    cluster: Cluster, kubeconfig: None, tmp_path: Path
) -> None:
    settings = load_settings(
        home=tmp_path / "home",
        launcher="kubernetes",
        kubernetes={"namespace": NAMESPACE, "in_cluster": False},
    )
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        cluster.add_node(name)
    launcher = build_launcher(settings, utcnow, fleet_source(settings))
    assert isinstance(launcher, KubernetesLauncher)
    launcher.close()
    fleet = fleet_source(settings)
    assert [n.name for n in fleet().nodes] == ["gpu-a", "gpu-b", "gpu-c"]
    cluster.api.patch_node("gpu-a", {"spec": {"unschedulable": True}})  # cordoned
    cluster.api.patch_node_status("gpu-b", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    cluster.api.delete_node("gpu-c")
    cluster.add_node("gpu-d")
    assert [n.name for n in fleet().nodes] == ["gpu-d"]


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    settings = load_settings(home=tmp_path / "home", launcher="kubernetes", kubernetes={"in_cluster": False})
    with pytest.raises(SettingsError, match="launcher: kubernetes needs a reachable Kubernetes API"):
        build_launcher(settings, utcnow, NO_FLEET)


def test_the_launcher_setting_takes_any_registered_name_and_refuses_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(home=tmp_path, launcher="slurm")  # a name: checked where parts are composed
    refused = r"launcher: expected one of \['kubernetes', 'local'\], got 'slurm'"
    for compose in (check_names, lambda s: build_launcher(s, utcnow, NO_FLEET), fleet_source):
        with pytest.raises(SettingsError, match=refused):
            compose(settings)
    monkeypatch.setitem(LAUNCHERS, "slurm", LAUNCHERS["local"])  # a new launcher: one entry, no other edit
    assert launcher_kind(settings) is LAUNCHERS["slurm"]
