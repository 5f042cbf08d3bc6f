"""The installed environment: what `make install` (and the image) change after pip."""

from __future__ import annotations

import importlib.metadata
import runpy
import subprocess
import sys
from pathlib import Path

SCRIPT = runpy.run_path(
    str(Path(__file__).resolve().parents[2] / "requirements" / "drop_feast_mlflow_plugin.py")
)
GROUP, drop = SCRIPT["GROUP"], SCRIPT["drop"]

FIRST_REQUEST = (
    "import sys\n"
    "from mlflow.tracking.request_header.registry import resolve_request_headers\n"
    "resolve_request_headers()\n"  # what MLflow does before a process's first request
    "print(sorted(m for m in sys.modules if m == 'feast' or m.startswith('feast.')))\n"
)


def test_an_mlflow_client_s_first_request_imports_no_feast() -> None:
    assert not [e for e in importlib.metadata.entry_points(group=GROUP) if e.value.startswith("feast")]
    done = subprocess.run([sys.executable, "-c", FIRST_REQUEST], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    assert drop().endswith("(nothing to do)")  # idempotent: make install runs it after every pip install
