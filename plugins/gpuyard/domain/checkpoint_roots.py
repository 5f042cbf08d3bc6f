"""Whose checkpoints lie where: each team's checkpoint roots at each site, and the one rule that a
checkpoint URL lies under one of them.

A team's roots at a site are those its admission policy names for that site (`checkpoint_roots`, set
by a platform admin), else `<the site's checkpoint store>/<team>`: the store of the site's entry in
the fleet file, else the platform's `checkpoint_store` setting. Where the platform names no store
and the team no roots (the embedded default), checkpoint URLs are not restricted, unless the
platform requires roots (profile production): then a team without any may not checkpoint.

The rule holds where a URL is admitted (the spec's `checkpoint.url`), where a worker records a
checkpoint (its job's own roots), and where the scheduler, with its own credentials, copies one to
another site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator, StrictStr

from gpuyard.domain.spec import JobSpec, SpecViolation

# Schemes of object stores (fsspec's names): what production keeps checkpoints in, never a node's disk.
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss"})
_MAX_DECODES = 8  # '%252e' is '%2e' once decoded, then '.': decode until nothing changes


def _decoded(segment: str) -> str:
    for _ in range(_MAX_DECODES):
        once = unquote(segment)
        if once == segment:
            break
        segment = once
    return segment


def _parts(url: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(scheme, authority, path segments) of a URL the prefix rule can judge, else None: a URL with a
    query, a fragment, a chained protocol ('::'), whitespace or control characters, or a segment that
    is, or decodes to, '.' or '..' or holds a '/' or '\\' (a layer that decodes would read another
    path than the one compared)."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url) or "::" in url:
        return None
    try:
        split = urlsplit(url)
    except ValueError:  # a malformed authority ('s3://[x/...')
        return None
    if not split.scheme or not url.startswith(f"{split.scheme}://") or "?" in url or "#" in url:
        return None
    segments = split.path.split("/")
    if split.path.startswith("/"):
        segments = segments[1:]
    if segments and segments[-1] == "":
        segments = segments[:-1]  # a trailing slash names the same folder
    for segment in segments:
        plain = _decoded(segment)
        if plain in (".", "..") or any(ch in plain for ch in "/\\\x00"):
            return None
    return split.scheme.lower(), split.netloc, tuple(segments)


def is_under(url: str, root: str) -> bool:
    """Is `url` the folder `root` or inside it? Segment by segment, as written: `s3://b/team-a-evil`
    is not under `s3://b/team-a`, nor is another scheme, bucket or host, nor any URL `_parts` cannot
    judge (dot segments, encoded ones, queries)."""
    found, folder = _parts(url), _parts(root)
    if found is None or folder is None or found[:2] != folder[:2]:
        return False
    return found[2][: len(folder[2])] == folder[2]


def is_object_store(url: str) -> bool:
    parts = _parts(url)
    return parts is not None and parts[0] in OBJECT_STORE_SCHEMES and bool(parts[1])


def checkpoint_root(value: str) -> str:
    """`value` as a checkpoint root, or ValueError saying why not."""
    if len(value) > 2048 or _parts(value) is None:
        raise ValueError(
            "expected a folder URL such as 's3://bucket/team-a' (no query, fragment, '.' or '..' "
            f"segments, percent-encoded separators or whitespace), got {value!r}"
        )
    return value


CheckpointRoot = Annotated[StrictStr, AfterValidator(checkpoint_root)]


def join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


@dataclass(frozen=True)
class CheckpointStores:
    """The platform's side: each site's checkpoint store (the fleet file's `sites:`), the store of the
    other sites (the `checkpoint_store` setting), the fleet's site names, and whether a team needs
    roots to checkpoint at all (profile production)."""

    by_site: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None
    site_names: frozenset[str] = frozenset()
    required: bool = False

    def store(self, site: str) -> str | None:
        return self.by_site.get(site) or self.default


def roots_at(
    team: str, site: str, configured: Mapping[str, tuple[str, ...]], stores: CheckpointStores
) -> tuple[str, ...]:
    """The team's roots at `site`: its policy's for the site, else `<the site's store>/<team>`."""
    if site in configured:
        return configured[site]
    store = stores.store(site)
    return (join(store, team),) if store else ()


def team_roots(
    team: str, sites: Iterable[str], configured: Mapping[str, tuple[str, ...]], stores: CheckpointStores
) -> tuple[str, ...] | None:
    """The team's roots at these sites, in order; None: URLs are not restricted (the platform names no
    store, the team no roots, and roots are not required)."""
    if not (stores.by_site or stores.default or configured or stores.required):
        return None
    roots = [root for site in sites for root in roots_at(team, site, configured, stores)]
    return tuple(dict.fromkeys(roots))


def roots_for(
    spec: JobSpec, configured: Mapping[str, tuple[str, ...]], stores: CheckpointStores
) -> tuple[str, ...] | None:
    """The roots of the spec's team at every site the job may run at."""
    return team_roots(spec.team, spec.sites or sorted(stores.site_names), configured, stores)


def job_roots(job_id: str, spec: JobSpec, team: tuple[str, ...] | None) -> tuple[str, ...]:
    """Where a job's checkpoints may be recorded: its spec's URL (while that lies under its team's
    roots), and its own folder under each of them, where a move to another site puts them."""
    url = spec.checkpoint.url if spec.checkpoint else None
    if team is None:
        return (url,) if url else ()
    own = tuple(join(root, job_id) for root in team)
    return ((url,) if url and any(is_under(url, root) for root in team) else ()) + own


def not_an_object_store(url: str) -> str:
    """Why `url` cannot hold checkpoints where they must be in an object store."""
    schemes = ", ".join(sorted(OBJECT_STORE_SCHEMES))
    return f"profile production keeps checkpoints in an object store ({schemes}), not on a disk: {url!r}"


def check_checkpoint_url(
    spec: JobSpec, roots: tuple[str, ...] | None, *, object_store: bool
) -> list[SpecViolation]:
    """The spec's checkpoint URL against its team's roots (None: not restricted); with `object_store`,
    the URL must also name an object store."""
    if spec.checkpoint is None:
        return []
    url, sites = spec.checkpoint.url, ", ".join(spec.sites) or "every site"
    if object_store and not is_object_store(url):
        rule = not_an_object_store(url)
    elif roots is None or any(is_under(url, root) for root in roots):
        return []
    elif not roots:
        rule = (
            f"team {spec.team} has no checkpoint root at {sites}: a platform admin sets the platform's "
            f"checkpoint_store or the team's checkpoint_roots (PUT /v1/teams/{spec.team}/policy)"
        )
    else:
        rule = f"must lie under one of team {spec.team}'s checkpoint roots {list(roots)}, got {url!r}"
    return [SpecViolation(path="checkpoint.url", rule=rule)]


def check_object_store_roots(configured: Mapping[str, tuple[str, ...]]) -> list[SpecViolation]:
    """A policy's roots that are not an object store's (refused where checkpoints must be in one)."""
    return [
        SpecViolation(path=f"checkpoint_roots.{site}.{index}", rule=not_an_object_store(root))
        for site, roots in configured.items()
        for index, root in enumerate(roots)
        if not is_object_store(root)
    ]
