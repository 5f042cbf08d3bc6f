"""The Airflow provider (providers/airflow-provider-gpuyard) as a platform team installs it into an
Airflow 3 deployment: what pip resolves for it, what its wheels carry and import, what Airflow
discovers from it, and the connection's Test button against a real `gpuyard up`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow_harness import PYTHON, ROOT, run_python
from servers import free_port
from stack import Gpuyard

pytestmark = pytest.mark.slow  # pip resolves Airflow; Airflow's CLI in processes; `gpuyard up`

PROVIDER = ROOT / "providers" / "airflow-provider-gpuyard"
CLIENT = ROOT / "clients" / "python"
AIRFLOW = str(Path(PYTHON).parent / "airflow")
# What installing the provider must never pull in: gpuyard's own stack and the pipelines' heavy parts.
HEAVY = {"gpuyard", "torch", "pyspark", "feast", "mlflow", "mlflow-skinny", "great-expectations"}


def pinned_airflow() -> str:
    """The Airflow this repository runs (its `pipeline` extra's pin): the deployment the provider joins."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(r for r in extras["pipeline"] if r.startswith("apache-airflow=="))


def copy_project(source: Path, into: Path) -> Path:
    """A copy of a distribution's folder to build from: a build in the checkout leaves its egg-info
    there, and where that folder is on sys.path Airflow finds the provider twice (and its plugin: an
    import error)."""
    ignored = shutil.ignore_patterns("*.egg-info", "__pycache__", "*.pyc", "build")
    return Path(shutil.copytree(source, into / source.name, ignore=ignored))


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The client's and the provider's wheels, built from copies of their folders."""
    scratch = tmp_path_factory.mktemp("wheels")
    out = scratch / "dist"
    sources = [copy_project(project, scratch / "src") for project in (CLIENT, PROVIDER)]
    subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), *sources],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {
        "client": next(out.glob("gpuyard_client-*.whl")),
        "provider": next(out.glob("airflow_provider_gpuyard-*.whl")),
    }


def test_pip_resolves_the_provider_without_gpuyard_or_its_heavy_dependencies(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """A fresh environment with Airflow only: `pip install` of the provider's and the client's wheels
    (no index has them) would install neither gpuyard nor torch, Spark, Feast, MLflow or Great
    Expectations."""
    fresh = tmp_path / "fresh"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=60)
    report = tmp_path / "report.json"
    started = time.monotonic()
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "pip",
            "--python",
            str(fresh / "bin" / "python"),
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            pinned_airflow(),
            *map(str, wheels.values()),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    resolved = {
        canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    print(f"resolved {len(resolved)} distributions in {time.monotonic() - started:.1f} s: {sorted(resolved)}")
    assert {"apache-airflow", "airflow-provider-gpuyard", "gpuyard-client", "httpx"} <= set(resolved)
    assert not HEAVY & set(resolved), HEAVY & set(resolved)
    assert not [name for name in resolved if name.startswith(("torch", "nvidia-"))]


def test_the_wheels_carry_every_module_the_page_and_the_entry_points(wheels: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(wheels["provider"]).namelist())
    package = PROVIDER / "gpuyard_provider"
    modules = {
        p.relative_to(PROVIDER).as_posix() for p in package.rglob("*") if p.suffix in (".py", ".css", ".js")
    }
    assert {"gpuyard_provider/ui/static/page.css", "gpuyard_provider/ui/static/page.js"} <= modules
    assert modules <= names, modules - names
    dist_info = "airflow_provider_gpuyard-0.1.0.dist-info"
    entry_points = zipfile.ZipFile(wheels["provider"]).read(f"{dist_info}/entry_points.txt").decode()
    assert (
        "[apache_airflow_provider]\nprovider_info = gpuyard_provider.get_provider_info:get_provider_info"
        in entry_points
    )
    assert "[airflow.plugins]\ngpuyard = gpuyard_provider.plugin:GpuyardPlugin" in entry_points
    metadata = zipfile.ZipFile(wheels["provider"]).read(f"{dist_info}/METADATA").decode()
    requires = sorted(
        line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    )
    assert requires == [
        "apache-airflow>=3.3.0",
        "gpuyard-client>=0.1.0",
        "httpx>=0.27",
        'mlflow; extra == "mlflow"',
    ]
    assert "gpuyard_client/__init__.py" in zipfile.ZipFile(wheels["client"]).namelist()


IMPORT_ALL = """
import json, sys
import gpuyard_provider.get_provider_info, gpuyard_provider.hooks.gpuyard, gpuyard_provider.links
import gpuyard_provider.operators.training, gpuyard_provider.plugin, gpuyard_provider.triggers.job
import gpuyard_provider.ui.app
from gpuyard_provider.get_provider_info import get_provider_info
print(json.dumps({
    "files": [m.__file__ for m in (gpuyard_provider, gpuyard_provider.ui.app, sys.modules["gpuyard_client"])],
    "package_name": get_provider_info()["package-name"],
    "loaded": sorted({name.split(".")[0] for name in sys.modules}),
}))
"""


def test_the_installed_wheels_import_nothing_of_gpuyard(wheels: dict[str, Path], tmp_path: Path) -> None:
    """Installed from the wheels alone (Airflow from this environment), every module of the provider
    imports without gpuyard, torch, Spark, Feast or MLflow; its info names its own distribution."""
    target = tmp_path / "site"
    subprocess.run(
        [PYTHON, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *wheels.values()],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPUYARD_"))}
    env |= {"PYTHONPATH": str(target), "AIRFLOW_HOME": str(tmp_path / "airflow")}
    done = subprocess.run(
        [PYTHON, "-c", IMPORT_ALL], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(path.startswith(f"{target}/") for path in report["files"]), report["files"]
    assert report["package_name"] == "airflow-provider-gpuyard"
    heavy = {"gpuyard", "torch", "pyspark", "feast", "mlflow", "great_expectations"}
    assert not heavy & set(report["loaded"]), heavy & set(report["loaded"])


def airflow_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIRFLOW, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def json_of(output: str) -> object:
    """The JSON document an `airflow ... -o json` printed (after any log lines)."""
    return json.loads(output[output.index("[") :])


DISCOVERED = """
import json
from airflow.providers_manager import ProvidersManager
manager = ProvidersManager()
hook = manager.hooks["gpuyard"]
ours = "airflow-provider-gpuyard"
print(json.dumps({
    "hook": [hook.hook_class_name, hook.connection_id_attribute_name, hook.package_name,
             hook.connection_testable],
    "behaviour": manager.field_behaviours["gpuyard"],
    "widgets": sorted(k for k in manager.connection_form_widgets if k.startswith("extra__gpuyard__")),
    "links": [c for c in manager.extra_links_class_names if c.startswith("gpuyard_provider.")],
    "triggers": [t.trigger_class_name for t in manager.trigger if t.package_name == ours],
}))
"""


def test_airflow_discovers_the_provider_and_its_connection_type(airflow_env: dict[str, str]) -> None:
    """The installed provider (`make install` installs it, editable) as Airflow's CLI and UI see it."""
    listed = airflow_cli(airflow_env, "providers", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr[-4000:]
    providers = {p["package_name"]: p for p in json_of(listed.stdout)}  # type: ignore[union-attr]
    assert providers["airflow-provider-gpuyard"]["version"] == "0.1.0"

    found = run_python(airflow_env, DISCOVERED)
    assert found["hook"] == [  # type: ignore[index]
        "gpuyard_provider.hooks.gpuyard.GpuyardHook",
        "gpuyard_conn_id",
        "airflow-provider-gpuyard",
        True,
    ]
    behaviour = found["behaviour"]  # type: ignore[index]
    assert behaviour["hidden_fields"] == ["schema", "login", "extra"]
    assert behaviour["relabeling"] == {"host": "API URL", "password": "Token"}
    assert found["widgets"] == [f"extra__gpuyard__{f}" for f in ("mlflow_ui_url", "scheme", "ui_url")]  # type: ignore[index]
    assert found["links"] == ["gpuyard_provider.links.GpuyardJobLink"]  # type: ignore[index]
    assert found["triggers"] == ["gpuyard_provider.triggers.job"]  # type: ignore[index]


# What POST /api/v2/connections/test does with the form's fields (airflow/api_fastapi/.../connections.py):
# a Connection under a transient id, exported as AIRFLOW_CONN_<ID> in its URI form, then its test.
TEST_BUTTON = """
import json, os
from airflow.models.connection import Connection
said = {}
for case, host, token in json.loads(os.environ["CASES"]):
    conn = Connection(conn_id=f"transient_{case}", conn_type="gpuyard", host=host, password=token)
    os.environ[f"AIRFLOW_CONN_TRANSIENT_{case.upper()}"] = conn.get_uri()
    said[case] = conn.test_connection()
print(json.dumps(said))
"""


@pytest.fixture
def gpuyard(tmp_path: Path) -> Iterator[Gpuyard]:
    home = tmp_path / "gpuyard"
    home.mkdir()
    server = Gpuyard(home, slots=1)
    try:
        yield server.start()
    finally:
        server.stop()


def test_the_connections_test_button_asks_the_api_who_the_token_is(
    airflow_env: dict[str, str], gpuyard: Gpuyard
) -> None:
    away = f"http://127.0.0.1:{free_port()}"  # nothing listens: the test says so at once, riding out nothing
    cases = [
        ["member", gpuyard.url, gpuyard.token],
        [
            "admin",
            gpuyard.url.removeprefix("http://"),
            gpuyard.admin_token,
        ],  # a host name: the scheme is http
        ["refused", gpuyard.url, "not-a-token"],
        ["away", away, gpuyard.token],
        ["tokenless", gpuyard.url, None],
    ]
    started = time.monotonic()
    said = run_python(airflow_env | {"CASES": json.dumps(cases)}, TEST_BUTTON)
    print(json.dumps(said, indent=1))
    assert time.monotonic() - started < 60  # none waits out an outage (GPUYARD_CLIENT_OUTAGE_S: 300 s)
    assert said["member"][0] is True and "team a, role member" in said["member"][1], said  # type: ignore[index]
    assert said["admin"][0] is True and "role platform-admin" in said["admin"][1], said  # type: ignore[index]
    assert said["refused"][0] is False and "refused the token" in said["refused"][1], said  # type: ignore[index]
    assert "(401)" in said["refused"][1]  # type: ignore[index]
    assert said["away"][0] is False, said  # type: ignore[index]
    assert said["away"][1].startswith(f"the gpuyard API at {away} did not answer: ConnectError"), said  # type: ignore[index]
    assert said["tokenless"][0] is False and "password must hold a gpuyard team token" in said["tokenless"][1]  # type: ignore[index]

    # The CLI's `airflow connections test`, on a deployment that enables it (as the UI's Test button needs).
    conn = json.dumps({"conn_type": "gpuyard", "host": gpuyard.url, "password": gpuyard.token})
    env = airflow_env | {"AIRFLOW_CONN_GPUYARD_DEFAULT": conn}
    enabled = airflow_cli(
        env | {"AIRFLOW__CORE__TEST_CONNECTION": "Enabled"}, "connections", "test", "gpuyard_default"
    )
    assert enabled.returncode == 0 and "Connection success!" in enabled.stdout, (
        enabled.stdout + enabled.stderr
    )
    assert gpuyard.token not in enabled.stdout + enabled.stderr
