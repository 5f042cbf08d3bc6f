"""A team's admission policy: which images (registries, digests) and priority classes its jobs may use,
and where their checkpoints may go (`checkpoint_roots.py` holds that rule).

Pure: `check_admission` returns every violation, each with the field path and the rule, like
`feasibility.check_quota` (the quota holds the GPU limits). The platform adds one rule of its own: in
production every image is pinned by digest, whatever the team's policy says.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

from gpuyard.domain.checkpoint_roots import CheckpointRoot
from gpuyard.domain.spec import JobSpec, Name, SpecViolation

DEFAULT_REGISTRY = "docker.io"
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_REGISTRY_PREFIX = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$"
)


def _registry_prefix(value: str) -> str:
    if len(value) > 255 or not _REGISTRY_PREFIX.match(value):
        raise ValueError(
            f"expected a registry with an optional path, such as 'ghcr.io/acme' or 'docker.io/library', "
            f"got {value!r}"
        )
    return value


RegistryPrefix = Annotated[StrictStr, AfterValidator(_registry_prefix)]
PriorityClass = Literal["low", "normal", "high"]


class AdmissionPolicy(BaseModel):
    """What a team's jobs may use. Empty lists allow everything (the default: no policy)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_registries: tuple[RegistryPrefix, ...] = Field(
        (),
        max_length=64,
        description="Registries (with an optional path) images may come from, e.g. 'ghcr.io/acme'; "
        "an image without a registry is on docker.io. Empty allows every registry.",
    )
    require_digest: StrictBool = Field(
        False, description="Images must be pinned by digest (@sha256:...); production always requires it."
    )
    allowed_priorities: tuple[PriorityClass, ...] = Field(
        (), max_length=3, description="Priority classes the team may use; empty allows every class."
    )
    checkpoint_roots: dict[Name, tuple[CheckpointRoot, ...]] = Field(
        default_factory=dict,
        max_length=64,
        description="Site -> folders the team's checkpoints may lie under there, e.g. "
        "{'east': ['s3://ckpt-east/vision']}. A site not named keeps the default, "
        "'<the site's checkpoint store>/<team>'.",
    )

    @field_validator("checkpoint_roots")
    @classmethod
    def _few_roots(cls, roots: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for site, folders in roots.items():
            if len(folders) > 16:
                raise ValueError(f"site {site}: at most 16 checkpoint roots, got {len(folders)}")
        return roots


def image_repository(image: str) -> str:
    """'python:3.11' -> 'docker.io/library/python'; 'ghcr.io/acme/x:1@sha256:..' -> 'ghcr.io/acme/x'.

    Docker's rule: the first component names a registry when it has a '.' or a ':' or is 'localhost'.
    """
    name = image.split("@", 1)[0]
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = DEFAULT_REGISTRY, name
        if "/" not in path:
            path = f"library/{path}"
    last = path.rsplit("/", 1)
    last[-1] = last[-1].split(":", 1)[0]  # the tag
    return f"{registry.lower()}/{'/'.join(last)}"


def _within(repository: str, prefix: str) -> bool:
    return repository == prefix or repository.startswith(prefix.rstrip("/") + "/")


def check_admission(spec: JobSpec, policy: AdmissionPolicy, *, require_digest: bool) -> list[SpecViolation]:
    """The team's policy (and the platform's digest rule when `require_digest`) against the spec."""
    violations = []
    repository = image_repository(spec.image)
    if policy.allowed_registries and not any(_within(repository, p) for p in policy.allowed_registries):
        violations.append(
            SpecViolation(
                path="image",
                rule=f"team {spec.team} may use images from {list(policy.allowed_registries)}, "
                f"not {repository}",
            )
        )
    if (require_digest or policy.require_digest) and not _DIGEST.search(spec.image):
        who = "this platform" if require_digest else f"team {spec.team}"
        violations.append(
            SpecViolation(
                path="image",
                rule=f"{who} requires images pinned by digest ('<image>@sha256:<64 hex digits>'), "
                f"got {spec.image!r}",
            )
        )
    if policy.allowed_priorities and spec.priority not in policy.allowed_priorities:
        violations.append(
            SpecViolation(
                path="priority",
                rule=f"team {spec.team} may use priority classes {list(policy.allowed_priorities)}, "
                f"not {spec.priority!r}",
            )
        )
    return violations
