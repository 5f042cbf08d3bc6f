"""Airflow's plugin manager finds the gpuyard plugin through the provider's entry point, and imports
nothing of the repository's plugins/ folder (the folder the repository's Airflow runs with)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from airflow_harness import PYTHON, ROOT, run_python

pytestmark = pytest.mark.slow  # Airflow's plugin manager in processes

LOAD = """
import json, sys
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
folder = %r
by_file = sorted(
    name for name, module in list(sys.modules.items())
    if (getattr(module, "__file__", None) or "").startswith(folder) and name.split(".")[0] != "gpuyard"
)
print(json.dumps({
    "plugins": [p["name"] for p in plugins_manager.get_plugin_info()],
    "sources": [[p.source.dist, type(p).__module__] for p in plugins_manager._get_plugins()[0]],
    "errors": plugins_manager.get_import_errors(),
    "loaded_by_file_name": by_file,
    "links": [type(link).__name__ for link in plugins_manager.get_operator_extra_links()],
}))
"""


def test_the_provider_registers_the_plugin_and_the_folder_adds_nothing(airflow_env: dict[str, str]) -> None:
    report = run_python(airflow_env, LOAD % str(ROOT / "plugins"))
    assert report["errors"] == {}
    assert report["plugins"].count("gpuyard") == 1
    # From the installed provider's `airflow.plugins` entry point, once (a second copy of the
    # provider's metadata on sys.path would register it twice: an import error, above). Every other
    # plugin is another installed provider's (OpenLineage's): none comes from the folder.
    assert ["airflow-provider-gpuyard", "gpuyard_provider.plugin"] in report["sources"]
    assert all(
        dist and dist.startswith(("airflow-provider-", "apache-airflow-providers-"))
        for dist, _ in report["sources"]
    )
    assert len(report["sources"]) == len(report["plugins"])
    # Nothing is imported by file name from the folder: clock.py, cli/__main__.py of the package
    # would otherwise become top-level modules (or exit the process).
    assert report["loaded_by_file_name"] == []
    assert report["links"] == ["GpuyardJobLink"]


def test_the_ignore_file_is_what_keeps_the_package_out(airflow_env: dict[str, str], tmp_path: Path) -> None:
    """Without plugins/.airflowignore the same folder does not load: the file is load-bearing."""
    bare = tmp_path / "plugins"
    bare.mkdir()
    (bare / "gpuyard").symlink_to(ROOT / "plugins" / "gpuyard")
    env = airflow_env | {"AIRFLOW__CORE__PLUGINS_FOLDER": str(bare)}
    result = subprocess.run(
        [PYTHON, "-c", LOAD % str(bare)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    # The package's modules import under their file names: cli/__main__.py runs gpuyard's command line
    # inside Airflow's process, which exits with its usage before any plugin is registered.
    said = result.stdout + result.stderr
    assert result.returncode == 2, said[-4000:]
    assert "Usage:" in said and "Submit a job." in said, said[-4000:]
