"""Images of the emulated cluster: an image reference names a local environment, as a registry names
a filesystem. `repository[:tag][@digest]` is looked up by its repository: a pod whose repository no
image has fails to pull (`ErrImagePull`, then `ImagePullBackOff`), as on a cluster. Pull time and
pull failure are settable per image, for the tests' slow and broken registries."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


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
