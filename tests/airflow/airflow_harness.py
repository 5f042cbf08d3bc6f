"""What the Airflow tests share: Airflow's environment for an AIRFLOW_HOME of the test's own (with the
repository's dags/ and plugins/), and running code under it.

Airflow reads its configuration when it is first imported, so every test that needs a configured
Airflow runs it in a subprocess (never in the pytest process itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def airflow_environment(home: Path, **extra: str) -> dict[str, str]:
    """The environment of an Airflow process whose state lives in `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPUYARD_", "MLFLOW_"))}
    env |= {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",  # as the repository's deployments set it
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "GX_ANALYTICS_ENABLED": "false",
        "PATH": f"{Path(PYTHON).parent}:{env.get('PATH', '/usr/bin:/bin')}",
    }
    return env | dict(extra)


def run_python(env: Mapping[str, str], code: str, timeout_s: float = 300) -> object:
    """Run `code` in a fresh interpreter under `env`; it prints one JSON document last, returned here."""
    result = subprocess.run(
        [PYTHON, "-c", code], env=dict(env), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
