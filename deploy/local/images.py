"""Images of the emulated cluster: an image reference names a local environment, as a registry names
a filesystem. `repository[:tag][@digest]` is looked up by its repository: a pod whose repository no
image has fails to pull (`ErrImagePull`, then `ImagePullBackOff`), as on a cluster. Pull time and
pull failure are settable per image, for the tests' slow and broken registries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Where an installed image keeps its environment and the project's installed packages, as a Dockerfile
# that builds a venv and installs the project's wheel into it would.
IMAGE_ROOT = "/opt/gpuyard"


@dataclass(frozen=True)
class LocalImage:
    """What a container of this image starts with: the image's environment (its `ENV`), under the
    pod's own variables, its working directory, and the files it carries (a directory or file of
    this machine at a path of the container's, read-only: a training image's configuration)."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    files: dict[str, str] = field(default_factory=dict)  # its filesystem's own: path -> this machine's
    pull_s: float = 0.0  # how long a pull takes
    pull_error: str | None = None  # why every pull fails (a registry's message), if it does


def repository(reference: str) -> str:
    """`registry.example/team/train:1@sha256:...` -> `registry.example/team/train`."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def python_image(
    *, files: dict[str, str] | None = None, sources: tuple[str, ...] = (), **overrides: object
) -> LocalImage:
    """This machine's Python environment (the one running the cluster: gpuyard, the training runtime,
    torch) as an image whose PATH finds `python` and its console scripts first. It carries the
    environment (`sys.prefix`) and `sources` (the folders an editable install points into) at their
    own paths, so a pod's volume at `/tmp` cannot hide them."""
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    carried = {folder: folder for folder in (sys.prefix, *sources)} | (files or {})
    return LocalImage(env={"PATH": path}, files=carried, **overrides)  # type: ignore[arg-type]


def installed_image(
    project: Path, build: Path, *, files: dict[str, str] | None = None, beside: Sequence[Path] = ()
) -> LocalImage:
    """The Python project at `project` as an image built from its wheel: this machine's environment
    (its third-party packages) at IMAGE_ROOT/venv, with the hooks of its editable installs hidden, and
    the project's wheel installed (not editable) at IMAGE_ROOT/lib, its working directory, where the
    packages' data files lie beside their modules; with it the wheels of the projects `beside` (the
    project's own dependencies that are editable installs here, which the hidden hooks would take
    away). Nothing on its interpreter's paths leads into a checkout: a pod runs the code the image
    was built with. (`python -m` only: the environment's console scripts still name this machine's
    interpreter in their first lines.)"""
    lib = build_wheel_install([project, *beside], build)
    venv, site = f"{IMAGE_ROOT}/venv", Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    empty = build / "empty"
    empty.touch()
    hidden = {  # after the environment itself: mounted in this order, over its files
        f"{venv}/{site}/{hook.name}": str(empty) for hook in Path(sys.prefix, site).glob("__editable__*")
    }
    path = os.pathsep.join([f"{venv}/bin", "/usr/local/bin", "/usr/bin", "/bin"])
    return LocalImage(
        env={"PATH": path, "PYTHONPATH": f"{IMAGE_ROOT}/lib"},
        workdir=f"{IMAGE_ROOT}/lib",
        files={venv: sys.prefix, **hidden, f"{IMAGE_ROOT}/lib": str(lib), **(files or {})},
    )


def build_wheel_install(projects: Sequence[Path], build: Path) -> Path:
    """The projects' wheels, each built from a copy of what it packages (pyproject.toml, its readme, its
    package folders: a build in the checkout would leave files there and pack stale ones), installed
    with no dependencies into `build`/lib; returns that folder."""
    shutil.rmtree(build, ignore_errors=True)
    wheels = build / "wheels"
    pip = [sys.executable, "-m", "pip", "-qq", "--disable-pip-version-check"]
    for number, project in enumerate(projects):
        metadata = tomllib.loads((project / "pyproject.toml").read_text())
        options = metadata["tool"]["setuptools"]
        folders = options["package-dir"].values() if "package-dir" in options else options["packages"]
        source = build / f"source-{number}"
        source.mkdir(parents=True)
        for name in ("pyproject.toml", metadata["project"].get("readme")):
            if name:
                shutil.copy2(project / name, source / name)
        for folder in folders:
            ignored = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(project / folder, source / folder, ignore=ignored, dirs_exist_ok=True)
        wheel = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source)]
        subprocess.run(wheel, check=True)
    built = [str(wheel) for wheel in wheels.glob("*.whl")]
    subprocess.run([*pip, "install", "--no-deps", "--target", str(build / "lib"), *built], check=True)
    return build / "lib"
