"""The image and the wheel it installs.

The review found no image (the manifests named one nothing built) and a non-editable wheel without
feature_repo/ or the pipeline definitions. The wheel is built and installed here into a fresh virtual
environment and run from outside the repository. Docker cannot build here (no daemon, no registry):
the Dockerfile is checked by reading it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpuyard.settings import load_settings

pytestmark = pytest.mark.slow  # builds and installs the wheel

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def build_wheel(project: Path, out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(project),
        ],
        check=True,
        capture_output=True,
    )
    name = tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]
    (built,) = out.glob(f"{name.replace('-', '_')}-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpuyard's HTTP client (clients/python), a dependency of gpuyard's that no index has: the image
    installs its wheel beside gpuyard's. Built from a copy (a build leaves its egg-info in the folder)."""
    source = tmp_path_factory.mktemp("client") / "python"
    shutil.copytree(
        ROOT / "clients/python", source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    return build_wheel(source, tmp_path_factory.mktemp("client-wheel"))


@pytest.fixture(scope="module")
def installed(wheel: Path, client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheels (no -e); their dependencies are read from this environment's
    site-packages (a plain path: the editable installs' finders there are not loaded)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
            str(client_wheel),
        ],
        check=True,
        capture_output=True,
        env={"PATH": f"{venv}/bin"},  # nothing of the caller's: a PYTHONPATH into a checkout holding an
        # egg-info would make pip take gpuyard for installed already
    )
    yield venv


def run(venv: Path, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [*args], cwd=cwd, capture_output=True, text=True, timeout=120, env={"PATH": f"{venv}/bin"}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_wheel_carries_the_data_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"feature_repo/{p.name}" for p in (ROOT / "feature_repo").iterdir() if p.suffix in (".py", ".yaml")
    } | {f"pipelines/{p.parent.name}/pipeline.yaml" for p in (ROOT / "pipelines").glob("*/pipeline.yaml")}
    assert "pipelines/flights_delay/pipeline.yaml" in expected
    # spark-submit runs a source's Spark jobs as files: the wheel carries their scripts
    expected |= {
        f"pipelines/{p.relative_to(ROOT / 'pipelines')}"
        for p in (ROOT / "pipelines").glob("*/spark_jobs/*.py")
    }
    assert "pipelines/flights_delay/spark_jobs/prepare_flights.py" in expected
    assert expected <= names, expected - names
    migrations = {p.name for p in (ROOT / "plugins/gpuyard/store/migrations/versions").glob("*.py")}
    assert {f"gpuyard/store/migrations/versions/{m}" for m in migrations} <= names


def test_the_installed_wheel_runs_from_outside_the_repository(installed: Path, tmp_path: Path) -> None:
    assert "migrate" in run(installed, "gpuyard", "--help", cwd=tmp_path)
    plan = run(
        installed,
        "gpuyard",
        *shlex.split("plan --params 7e9 --layers 32 --hidden 4096 --heads 32"),
        cwd=tmp_path,
    )
    assert plan.startswith("strategy: dp=") and "per-GPU memory" in plan
    where = run(
        installed,
        "python",
        "-c",
        "import gpuyard, pipelines.features as f, pipelines.prepare, pipelines.validate, training.run;"
        "from pipelines.definition import load_definition;"
        "print(gpuyard.__file__); print(f.SOURCE_REPO); print(load_definition('flights_delay').name)",
        cwd=tmp_path,
    ).split()
    site = str(next((installed / "lib").glob("python3*/site-packages")))
    assert where[0].startswith(site) and where[1].startswith(site)  # the wheel's copy, not the repository
    assert (Path(where[1]) / "feature_store.yaml").is_file() and (Path(where[1]) / "definitions.py").is_file()
    assert where[2] == "flights_delay"


def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), grouped by stage."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    found: list[list[str]] = []
    for line in (line.strip() for line in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            found.append([])
        if found:
            found[-1].append(line)
    return found


def test_the_dockerfile_builds_from_a_pinned_base_as_a_non_root_user() -> None:
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert base is not None and re.fullmatch(
        r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base[1]
    )
    build, final = stages()  # multi-stage: the build tools and the wheel stay in the first
    assert all(stage[0].startswith("FROM ${PYTHON_IMAGE}") for stage in (build, final))
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    pod = yaml.safe_load((ROOT / "deploy/api.yaml").read_text().split("\n---")[0])["spec"]["template"]["spec"]
    assert users == [f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"]
    assert pod["securityContext"]["runAsUser"] != 0
    steps = " ".join(build)
    assert "torch==2.13.0" in steps and "download.pytorch.org/whl/${TORCH_VARIANT}" in steps
    assert "ARG TORCH_VARIANT=cpu" in build
    assert "ARG EXTRAS=pipeline,training" in build  # the workers' torch is the training extra
    assert re.search(r"pip wheel --no-deps .* --wheel-dir /wheels \.", steps)
    assert (
        "-c requirements/constraints.txt" in steps and " -e " not in steps
    )  # the wheel, pinned, not editable
    assert not [
        line for line in final if line.startswith(("RUN pip", "COPY ")) and "--from=build" not in line
    ]


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    copied = [
        source
        for stage in stages()
        for line in stage
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]  # COPY <source>... <destination>
    ]
    assert all((ROOT / source).exists() for source in copied), copied
    allowed = [line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    assert sorted(allowed) == sorted(copied)  # the context holds exactly what is copied: no .venv, no state


def test_the_image_exposes_the_ports_of_the_settings_and_deploy_names_it_once(tmp_path: Path) -> None:
    defaults = load_settings(home=tmp_path)
    (exposed,) = [line.split()[1:] for stage in stages() for line in stage if line.startswith("EXPOSE")]
    assert exposed == [str(defaults.port), str(defaults.scheduler_probe_port), str(defaults.relay_probe_port)]
    kustomization = yaml.safe_load((ROOT / "deploy/kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["newTag"] == VERSION
    named = set()
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((ROOT / "deploy" / name).read_text()):
            pod = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            named |= {c["image"] for c in pod.get("containers", [])}
    assert named == {f"{image['name']}:{VERSION}"}
