"""One settings object: environment (GPUYARD_*), an optional YAML file, then defaults.

`profile` picks the embedded parts (SQLite, in-process bus, local launcher) or the production
parts (PostgreSQL, Redis Streams, Kubernetes) of DESIGN.md section 6; every part can be set on its
own, and combinations that cannot work are refused at start with the setting named.

The ground floor: plain values, importing nothing of gpuyard but its domain types. The parts take
their settings when `services.py` composes them, and it is there that the names a setting gives a
part (`launcher`, `scheduler_policy`) are checked against the parts' registries. Defaults of parts
that are also built without settings (the bus's and the store's bounds) live here, once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gpuyard.domain.checkpoint_roots import (
    CheckpointStores,
    checkpoint_root,
    is_object_store,
    not_an_object_store,
)
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet, Site, load_fleet, local_fleet
from gpuyard.domain.spec import Name
from gpuyard.domain.tokens import TokenPolicy
from gpuyard.settings.kubernetes import KubernetesConfig
from gpuyard.settings.sites import SiteSettings, check_sites, with_shared_kubernetes

# Bounds on waiting (docs/faults.md), the defaults of RedisStreamsBus and DbBounds too.
BUS_TIMEOUT_S = 5.0
DB_STATEMENT_TIMEOUT_S = 10.0
DB_IDLE_IN_TRANSACTION_S = 60.0
DB_KEEPALIVE_S = 10.0

# Who local workers run as (launchers/worker_env.py).
WorkerUsers = Literal["auto", "on", "off"]


class MoveSettings(BaseModel):
    """Moves between sites (docs/scheduler.md, "Sites"): the WAN a move's copy is estimated over, and
    how long the copy may take."""

    model_config = ConfigDict(extra="forbid")

    wan_gbit_s: float | None = Field(
        None,
        gt=0,
        description="Usable bandwidth of one copy between two sites, Gbit/s; unset: moves are not charged "
        "(the `move` site rule places by the scores, as `any`).",
    )
    wan_rtt_seconds: float = Field(0.04, ge=0, description="Round-trip time between two sites.")
    egress_usd_per_gb: float = Field(0.0, ge=0, description="Price of a GB leaving a site.")
    deadline_factor: float = Field(
        3.0, ge=1, description="A copy is abandoned after this many times the scheduler's estimate of it..."
    )
    deadline_floor_seconds: float = Field(600.0, gt=0, description="...and at least this long.")
    attempts: int = Field(5, ge=1, description="Tries of one copy, each resuming after the files landed.")
    backoff_seconds: float = Field(
        2.0, ge=0, description="The first wait between tries, doubling (max 60 s)."
    )


class SettingsError(ValueError):
    """A setting is missing, malformed or contradicts another; the message names it."""


def default_home() -> Path:
    return Path(os.environ.get("GPUYARD_HOME") or Path.home() / ".gpuyard")


class _YamlFile(PydanticBaseSettingsSource):
    """Settings from `$GPUYARD_CONFIG`, else `<home>/config.yaml` when it exists."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None):
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = yaml.safe_load(self.path.read_text()) or {}
        except yaml.YAMLError as error:
            raise SettingsError(f"config file {self.path}: not valid YAML: {error}") from error
        if not isinstance(data, dict):
            raise SettingsError(f"config file {self.path}: expected a mapping of settings")
        return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUYARD_", extra="forbid", env_nested_delimiter="__")

    profile: Literal["embedded", "production"] = "embedded"
    home: Path = Field(default_factory=default_home)
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite under home.")
    bus: Literal["memory", "redis"] | None = None
    redis_url: str | None = None
    redis_stream: str = Field("gpuyard:events", min_length=1, description="Stream the relay publishes to.")
    launcher: str | None = Field(
        None, description="A name in the launcher registry (LAUNCHERS), checked where the parts are composed."
    )
    fleet_file: Path | None = None
    checkpoint_store: str | None = Field(
        None,
        description="fsspec URL of the checkpoint store of every site the fleet file names none for: a "
        "team's default checkpoint root there is '<store>/<team>' (docs/security.md, Checkpoint roots).",
    )
    local_slots: int = Field(2, ge=1, description="CPU slots (GPU type 'cpu') of the local fleet.")
    default_quota: TeamQuota = Field(default_factory=TeamQuota)
    tokens: TokenPolicy = Field(default_factory=TokenPolicy, description="API token lifetimes.")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(1 << 20, ge=1024)
    relay_batch_size: int = Field(200, ge=1, le=10_000)
    relay_poll_seconds: float = Field(0.05, gt=0, description="The relay's poll after a batch.")
    relay_idle_poll_seconds: float = Field(
        1.0, gt=0, description="The longest an idle relay waits between polls (each empty poll doubles it)."
    )
    db_pool_size: int = Field(16, ge=1)
    probe_host: str = Field("0.0.0.0", description="Where the scheduler and relay serve their probes.")
    scheduler_probe_port: int = Field(9101, ge=0, le=65535, description="The scheduler's probes and metrics.")
    relay_probe_port: int = Field(9102, ge=0, le=65535, description="The relay's probes and metrics.")
    probe_stall_seconds: float = Field(
        300.0, ge=1, description="/healthz fails once a scheduler's or relay's loop is stuck this long."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Server processes log records at this level and above."
    )
    log_format: Literal["text", "json"] | None = Field(
        None, description="text (key=value lines) or json (one object a line); default: json in production."
    )
    migrate_at_start: bool | None = Field(
        None,
        description="Processes migrate the schema as they start; default: embedded yes, production no "
        "(run `gpuyard migrate` once; replicas refuse a schema that is not at head).",
    )
    # Bounds on waiting (docs/faults.md: what each component does when they fire).
    db_statement_timeout_seconds: float = Field(
        DB_STATEMENT_TIMEOUT_S,
        ge=1,
        description="PostgreSQL cancels a statement running longer; the client gives up 5 s after.",
    )
    db_idle_in_transaction_seconds: float = Field(
        DB_IDLE_IN_TRANSACTION_S, ge=1, description="A session idle inside a transaction is ended."
    )
    db_keepalive_seconds: float = Field(
        DB_KEEPALIVE_S, ge=1, description="TCP keepalive: an idle connection is probed after this."
    )
    bus_timeout_seconds: float = Field(
        BUS_TIMEOUT_S, gt=0, description="Longest wait for Redis: connecting and each command."
    )
    lease_seconds: float = Field(60.0, ge=1, description="Lease period: a worker silent this long is LOST.")
    grace_seconds: float = Field(30.0, ge=0, description="Time a worker has to checkpoint when told to stop.")
    scheduler_policy: str = Field(
        "gpuyard",
        description="A policy in the scheduler's POLICIES (fifo, kueue, gpuyard, ...), checked where the "
        "parts are composed.",
    )
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    sites: dict[Name, SiteSettings] = Field(
        default_factory=dict,
        description="Sites over several clusters, each its own Kubernetes API (`kubernetes` overriding the "
        "shared settings), checkpoint store and data prefixes (settings/sites.py); none: one cluster.",
    )
    moves: MoveSettings = Field(default_factory=MoveSettings)
    api_url: str | None = Field(
        None, description="URL workers use to reach the API; default: where it listens."
    )
    worker_dir: Path | None = Field(None, description="Working directory of local workers; default: cwd.")
    worker_users: WorkerUsers = Field(
        "auto",
        description="Local workers run as their team's user where the launcher is root: on, off, or auto "
        "(on when every user may run this environment's interpreter; docs/security.md).",
    )
    worker_env_passthrough: tuple[str, ...] = Field(
        (), description="Names of the launcher's environment passed to local workers, beyond the allowlist."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = os.environ.get("GPUYARD_CONFIG")
        path = Path(config) if config else default_home() / "config.yaml"
        if config and not path.exists():
            raise SettingsError(f"GPUYARD_CONFIG points at {path}, which does not exist")
        return (init_settings, env_settings, _YamlFile(settings_cls, path))

    @model_validator(mode="before")
    @classmethod
    def _site_clusters(cls, data: Any) -> Any:
        return with_shared_kubernetes(data)

    @model_validator(mode="after")
    def _resolve(self) -> Settings:
        production = self.profile == "production"
        if self.bus is None:
            self.bus = "redis" if production else "memory"
        if self.launcher is None:
            self.launcher = "kubernetes" if production else "local"
        if self.log_format is None:
            self.log_format = "json" if production else "text"
        if self.migrate_at_start is None:
            self.migrate_at_start = not production
        if self.database_url is None:
            if production:
                raise ValueError("database_url (GPUYARD_DATABASE_URL) is required with profile=production")
            self.database_url = f"sqlite:///{self.home / 'gpuyard.db'}"
        if not self.database_url.startswith(("sqlite", "postgresql")):
            raise ValueError(f"database_url must be sqlite:// or postgresql://, got {self.database_url!r}")
        if production and self.database_url.startswith("sqlite"):
            raise ValueError("database_url: profile=production needs PostgreSQL, not SQLite")
        if self.bus == "redis" and not self.redis_url:
            raise ValueError("redis_url (GPUYARD_REDIS_URL) is required with bus=redis")
        if production and self.bus == "memory":
            raise ValueError("bus: profile=production cannot use the in-process bus; use bus=redis")
        if self.checkpoint_store is not None:
            self.checkpoint_store = checked_store("checkpoint_store", self.checkpoint_store, self)
        if self.fleet_file is not None and not self.fleet_file.exists():
            raise ValueError(f"fleet_file: {self.fleet_file} does not exist")
        if self.sites:
            if self.launcher == "local":
                raise ValueError(
                    "sites: each site is a cluster reached through its own Kubernetes API; the local "
                    "launcher runs on this machine (launcher: kubernetes)"
                )
            check_sites(self.sites, self.lease_seconds)
            for name, site in self.sites.items():
                if site.checkpoint_store is not None:
                    checked_store(f"sites.{name}.checkpoint_store", site.checkpoint_store, self)
        return self

    def site_entries(self) -> tuple[Site, ...]:
        """The `sites` that name a checkpoint store, as the fleet carries them."""
        return tuple(
            Site(name=name, checkpoint_store=site.checkpoint_store)
            for name, site in self.sites.items()
            if site.checkpoint_store is not None
        )

    def checkpoint_stores(self, fleet: Fleet) -> CheckpointStores:
        """The fleet's sites' checkpoint stores and this platform's default; production requires roots."""
        return fleet.checkpoint_stores(self.checkpoint_store, required=self.profile == "production")

    @property
    def checkpoints_in_object_store(self) -> bool:
        """Production with workers on other machines than the API's (any launcher but the local one,
        whose workers share this machine's disk): every checkpoint root is an object store's."""
        return self.profile == "production" and self.launcher != "local"

    @property
    def is_sqlite(self) -> bool:
        return str(self.database_url).startswith("sqlite")

    def fleet(self) -> Fleet:
        """The fleet file's fleet (its sites' checkpoint stores checked as `checkpoint_store` is; or
        the `sites` setting's, which then name the sites), else this machine's."""
        if not self.fleet_file:
            return local_fleet(self.local_slots)
        fleet = load_fleet(self.fleet_file)
        if self.sites:
            if fleet.sites:
                raise SettingsError(
                    f"fleet_file {self.fleet_file}: names sites, and so does the `sites` setting: name "
                    "them in one place"
                )
            return fleet.model_copy(update={"sites": self.site_entries()})
        for site in fleet.sites:
            where = f"fleet_file {self.fleet_file}: sites.{site.name}.checkpoint_store"
            try:
                checked_store(where, site.checkpoint_store, self)
            except ValueError as error:
                raise SettingsError(str(error)) from None
        return fleet


def checked_store(name: str, url: str, settings: Settings) -> str:
    """`url` as the checkpoint store named `name` (a setting, a fleet site's), or ValueError naming it."""
    try:
        checkpoint_root(url)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    if settings.checkpoints_in_object_store and not is_object_store(url):
        raise ValueError(f"{name}: {not_an_object_store(url)}")
    return url


def load_settings(**overrides: Any) -> Settings:
    """Build the settings or raise SettingsError naming the broken setting."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        raise SettingsError(f"invalid settings: {problems}") from None
