"""The emulated cluster's installed image (local_cluster.images.installed_image): a pod runs the project
as its wheel installed it, with its configuration inside the image, and nothing it imports or reads
comes from the checkout it was built from."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_cluster.agent import NodeSpec
from local_cluster.cluster import EmulatedCluster
from local_cluster.images import IMAGE_ROOT, installed_image
from servers import open_directory, wait_until

from .test_agent import IMAGE, phase

CHECKOUT = Path(__file__).resolve().parents[2]

# What the pod's interpreter runs from: its prefix and path, the project's modules and the flagship
# pipeline's definition as the training runtime finds it (relative to its working directory).
WHERE = """
import json, os, sys
import gpuyard, gpuyard.cli, gpuyard_client, pipelines, training
from pipelines.definition import load_definition
definition = load_definition("flights_delay")
json.dump({
    "prefix": sys.prefix,
    "path": sys.path,
    "modules": [gpuyard.__file__, gpuyard_client.__file__, pipelines.__file__, training.__file__],
    "definition": str(definition.path),
    "relative": os.path.realpath("pipelines/flights_delay/pipeline.yaml"),
}, open(sys.argv[1], "w"))
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    image = installed_image(CHECKOUT, tmp_path / "build", beside=[CHECKOUT / "clients" / "python"])
    with EmulatedCluster([NodeSpec("node-a")], {IMAGE: image}, tmp_path / "nodes") as made:
        made.add_namespace("team-a")
        yield made


def test_a_pod_runs_the_installed_wheel_and_nothing_of_the_checkout(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    with open_directory() as shared:  # the pod writes its answer here: it sees this machine's files
        command = ["python", "-c", WHERE, f"{shared}/w"]
        container = {"name": "worker", "image": f"{IMAGE}:1", "command": command}
        body = {
            "metadata": {"name": "where", "namespace": "team-a"},
            "spec": {"containers": [container], "restartPolicy": "Never"},
        }
        cluster.api.create_namespaced_pod("team-a", body)
        ended = wait_until(lambda: (s := phase(cluster, "where")) in ("Succeeded", "Failed") and s, 120)
        logs = [p.read_text() for p in (tmp_path / "nodes").rglob("log")]
        assert ended == "Succeeded", logs
        where = json.loads((shared / "w").read_text())
    lib = f"{IMAGE_ROOT}/lib"
    assert where["prefix"] == f"{IMAGE_ROOT}/venv"
    assert all(module.startswith(f"{lib}/") for module in where["modules"]), where["modules"]
    definition = f"{lib}/pipelines/flights_delay/pipeline.yaml"
    assert where["definition"] == where["relative"] == definition
    paths = [*where["path"], *where["modules"], where["definition"]]
    assert not [p for p in paths if p.startswith(str(CHECKOUT))], where["path"]
