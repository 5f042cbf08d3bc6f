"""Sites of a platform over several clusters: each its own Kubernetes API, checkpoint store and data.

`sites:` names them. A site's `kubernetes` is the shared `kubernetes` settings with the fields it
gives overridden (how its API is reached: `in_cluster`, `kubeconfig`, `context`; its MLflow server,
`mlflow_tracking_uri`; its `request_timeout_s`, ...), its `checkpoint_store` the store a team's
default root there lies in (`<store>/<team>`), opened by the scheduler's copies between sites with
its `checkpoint_store_options` (fsspec storage options: an S3 endpoint and its credentials), its
`data_prefixes` the URL prefixes of the data its
nodes read. Every node its API lists is at that site, whatever the node's site label says.

A store option's value may name where the secret is instead of holding it: `{from_env: NAME}` (a
variable of the scheduler's environment, as a Kubernetes Secret's `envFrom` sets it) or `{from_file:
PATH}` (a Secret mounted as files); the scheduler reads them as it starts (`resolved_store_options`),
so the settings (a ConfigMap, a file in a repository) hold no credential.

Plain values and pure checks; each error names the field (`sites.<name>.<field>`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from gpuyard.settings.kubernetes import KubernetesConfig


class SiteSettings(BaseModel):
    """One site: a cluster with its own Kubernetes API, its checkpoint store and the data it reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig,
        description="The shared `kubernetes` settings, with the fields given here overridden for this "
        "site's cluster (in_cluster, kubeconfig, context, mlflow_tracking_uri, request_timeout_s, ...).",
    )
    checkpoint_store: StrictStr | None = Field(
        None,
        description="fsspec URL of the site's checkpoint store; unset: the `checkpoint_store` setting's.",
    )
    checkpoint_store_options: dict[StrictStr, Any] = Field(
        default_factory=dict,
        description="fsspec storage options the scheduler opens the site's checkpoint store with when it "
        "copies a checkpoint to or from the site (s3: endpoint_url, key, secret, ...); a value may be "
        "{from_env: NAME} or {from_file: PATH}, read as the scheduler starts; empty: fsspec reads the "
        "scheduler's environment.",
    )
    data_prefixes: tuple[StrictStr, ...] = Field(
        (), description="URL prefixes of the data the site's nodes read; empty: they reach all data."
    )

    @field_validator("checkpoint_store_options")
    @classmethod
    def _references_are_well_formed(cls, options: dict[str, Any]) -> dict[str, Any]:
        for key, value in options.items():
            if is_reference(value):
                reference(key, value)  # raises, naming the key
        return options


# Where a store option's secret may be read from (`{source: where}`).
SOURCES = ("from_env", "from_file")


def is_reference(value: Any) -> bool:
    """A mapping that names a source (`from_env`, `from_file`): an option's reference, well formed or not."""
    return isinstance(value, Mapping) and bool(set(value) & set(SOURCES))


def reference(key: str, value: Mapping[str, Any]) -> tuple[str, str]:
    """(source, where) of an option's reference; ValueError naming the option when it is not one."""
    if len(value) != 1 or not isinstance(where := next(iter(value.values())), str) or not where:
        raise ValueError(
            f"{key}: a reference is one of {{from_env: NAME}} or {{from_file: PATH}}, got {dict(value)}"
        )
    return next(iter(value)), where


def resolved_store_options(
    site: str,
    options: Mapping[str, Any],
    env: Mapping[str, str],
    read: Callable[[Path], str] = Path.read_text,
) -> dict[str, Any]:
    """A site's store options with each reference replaced by what it names (a file's text without
    its trailing newline); ValueError naming the option when the variable is unset or the file cannot
    be read."""
    resolved = {}
    for key, value in options.items():
        if not is_reference(value):
            resolved[key] = value
            continue
        source, where = reference(key, value)
        field = f"sites.{site}.checkpoint_store_options.{key}"
        if source == "from_env":
            if where not in env:
                raise ValueError(f"{field}: from_env {where}, which the scheduler's environment does not set")
            resolved[key] = env[where]
        else:
            try:
                resolved[key] = read(Path(where)).rstrip("\n")
            except OSError as error:
                raise ValueError(f"{field}: from_file {where}: {error.strerror or error}") from None
    return resolved


def with_shared_kubernetes(data: Any) -> Any:
    """The raw settings with each site's `kubernetes` laid over the shared `kubernetes` settings, so
    that a site's cluster is validated whole, its errors at `sites.<name>.kubernetes.<field>`."""
    if not isinstance(data, dict) or not isinstance(data.get("sites"), Mapping):
        return data
    shared = data.get("kubernetes") or {}
    if isinstance(shared, KubernetesConfig):
        shared = shared.model_dump(exclude_unset=True)
    if not isinstance(shared, Mapping):
        return data  # the shared settings' own error is reported at `kubernetes`
    sites: dict[Any, Any] = {}
    for name, site in data["sites"].items():
        if isinstance(site, Mapping) and isinstance(site.get("kubernetes", {}), Mapping):
            site = {**site, "kubernetes": {**shared, **(site.get("kubernetes") or {})}}
        sites[name] = site
    return {**data, "sites": sites}


def check_sites(sites: Mapping[str, SiteSettings], lease_s: float) -> None:
    """ValueError naming the field when the sites cannot be told apart or one could stall the lead:
    two sites in the cluster this process runs in, two reaching the same API, or a site's request
    timeout over half the lease (a call inside a fenced transaction holds the lead's lease row; half
    a lease is how long the lead may go unrenewed)."""
    in_cluster = [name for name, site in sites.items() if site.kubernetes.in_cluster]
    if len(in_cluster) > 1:
        raise ValueError(
            f"sites: {', '.join(in_cluster)} all say in_cluster: true, but only one site can be the "
            "cluster this process runs in; reach the others through `kubernetes: {in_cluster: false, "
            "kubeconfig: ..., context: ...}`"
        )
    reached: dict[tuple[str | None, str | None], str] = {}
    for name, site in sites.items():
        config = site.kubernetes
        if config.request_timeout_s > lease_s / 2:
            raise ValueError(
                f"sites.{name}.kubernetes.request_timeout_s: {config.request_timeout_s:g} s is over half "
                f"the lease ({lease_s / 2:g} s): a site that stops answering would hold the lead that long"
            )
        if config.in_cluster:
            continue
        where = (config.kubeconfig, config.context)
        if where in reached:
            raise ValueError(
                f"sites.{name}.kubernetes: reaches the same API as site {reached[where]} (kubeconfig "
                f"{config.kubeconfig or 'default'}, context {config.context or 'current'}); give each "
                "site its own kubeconfig or context"
            )
        reached[where] = name
