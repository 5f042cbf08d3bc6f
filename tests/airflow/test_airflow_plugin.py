"""Airflow's plugin manager loads the repository's plugins/ folder: the thin plugin, nothing else."""

from __future__ import annotations

import json
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
    "errors": plugins_manager.get_import_errors(),
    "loaded_by_file_name": by_file,
    "links": [type(link).__name__ for link in plugins_manager.get_operator_extra_links()],
}))
"""


def test_plugins_folder_loads_without_import_errors(airflow_env: dict[str, str]) -> None:
    report = run_python(airflow_env, LOAD % str(ROOT / "plugins"))
    assert report["errors"] == {}
    assert report["plugins"] == ["gpuyard"]
    # Only the thin plugin file is imported by file name; clock.py, client.py, cli/__main__.py
    # of the package would otherwise become top-level modules (or exit the process).
    assert report["loaded_by_file_name"] == ["gpuyard_plugin"]
    assert report["links"] == ["GpuyardJobLink"]


def test_the_ignore_file_is_what_keeps_the_package_out(airflow_env: dict[str, str], tmp_path: Path) -> None:
    """Without plugins/.airflowignore the same folder does not load: the file is load-bearing."""
    bare = tmp_path / "plugins"
    bare.mkdir()
    (bare / "gpuyard_plugin.py").write_text((ROOT / "plugins" / "gpuyard_plugin.py").read_text())
    (bare / "gpuyard").symlink_to(ROOT / "plugins" / "gpuyard")
    env = airflow_env | {"AIRFLOW__CORE__PLUGINS_FOLDER": str(bare)}
    result = subprocess.run(
        [PYTHON, "-c", LOAD % str(bare)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    # The package's modules import under their file names and fail: hooks/gpuyard.py shadows the
    # package itself (so cli/__main__.py cannot import it) and migrations/env.py runs alembic.
    assert result.returncode == 0, f"the plugin manager crashed:\n{result.stderr[-4000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failed = {Path(path).relative_to(bare).as_posix() for path in report["errors"]}
    assert {"gpuyard/cli/__main__.py", "gpuyard/store/migrations/env.py"} <= failed, report["errors"]
    assert "clock" in report["loaded_by_file_name"], report["loaded_by_file_name"]
