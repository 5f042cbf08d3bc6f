"""Feature step: renders the Feast repository for a pipeline, applies it and materializes the online store.

``feature_repo/`` is the source of the definitions: one file of feature views per data source (its
``Source.feature_views``: flights' ``definitions.py``), beside the stores' configurations.
:func:`render_repo` copies the pipeline's source's file as ``definitions.py`` to a working directory
(default ``<data_root>/feast_repo``), picks ``feature_store.yaml`` (embedded) or
``feature_store.production.yaml`` by ``feast.variant``, and writes ``repo_settings.json`` naming the
prepared data root, so no run ever writes into the source tree.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import logging
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pipelines import sources, storage
from pipelines.config import PipelineConfig
from pipelines.errors import ConfigError, MissingDataError

if TYPE_CHECKING:
    from feast import FeatureService, FeatureStore

log = logging.getLogger(__name__)

SOURCE_REPO = sources.FEATURE_REPO
STORE_FILES = {"embedded": "feature_store.yaml", "production": "feature_store.production.yaml"}
OFFLINE_SOURCES = {"embedded": "file", "production": "spark"}


def repo_dir(config: PipelineConfig) -> Path:
    if config.feast_repo_dir:
        return Path(config.feast_repo_dir).absolute()
    if not storage.is_local(config.data_root):
        raise ConfigError(
            f"feast.repo_dir must be set when data_root {config.data_root!r} is not local "
            "(the rendered Feast repository is a local directory)"
        )
    return Path(storage.local_path(config.data_root)) / "feast_repo"


def render_repo(config: PipelineConfig, dest: Path | None = None) -> Path:
    """Copy the Feast repository to ``dest`` configured for ``config``: the views of its data source
    and its variant's store; returns the rendered directory."""
    dest = dest or repo_dir(config)
    views = sources.of(config).feature_views_file
    if not views.is_file():
        raise MissingDataError(f"the Feast definitions of source {config.source!r}, {views}, do not exist")
    store_file = SOURCE_REPO / STORE_FILES[config.feast_variant]
    if not store_file.is_file():
        raise MissingDataError(
            f"Feast store config {store_file} for variant {config.feast_variant!r} is missing"
        )
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(views, dest / "definitions.py")
    shutil.copy2(store_file, dest / "feature_store.yaml")
    (dest / "data").mkdir(exist_ok=True)
    settings = {
        "prepared_root": storage.feast_path(storage.join(config.data_root, "prepared")),
        "offline_source": OFFLINE_SOURCES[config.feast_variant],
        "variant": config.feast_variant,
    }
    (dest / "repo_settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    return dest


def import_feast() -> ModuleType:
    """The ``feast`` package, imported with typeguard's ``@typechecked`` made a pass-through while it
    loads. Feast decorates its classes' methods with it, and for each one typeguard parses and compiles
    the method's whole module again: 3 of the 4.6 CPU seconds that importing feast costs, in every
    process that does (each Airflow task of the feature steps). Feast's own checks of its arguments'
    types go with it; its errors on bad values stay. Every import of feast in gpuyard goes through here.
    """
    if "feast" not in sys.modules:
        import typeguard

        checked = typeguard.typechecked
        typeguard.typechecked = _unchecked  # type: ignore[assignment]
        try:
            importlib.import_module("feast")
        finally:
            typeguard.typechecked = checked
    return sys.modules["feast"]


def _unchecked(target: Any) -> Any:
    return target


def load_definitions(repo: Path) -> ModuleType:
    """Import the rendered ``definitions.py`` under a name unique to its directory."""
    import_feast()  # before the definitions' own `from feast import ...`
    name = f"_gpuyard_feature_repo_{abs(hash(str(repo.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, repo / "definitions.py")
    if spec is None or spec.loader is None:
        raise MissingDataError(f"cannot import Feast definitions from {repo}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def feast_objects(module: ModuleType) -> list[Any]:
    feast = import_feast()
    kinds = (feast.Entity, feast.FeatureView, feast.FeatureService)
    return [v for v in vars(module).values() if isinstance(v, kinds)]


def get_store(config: PipelineConfig) -> FeatureStore:
    """The FeatureStore of the rendered repository (render it first with :func:`apply`)."""
    repo = repo_dir(config)
    if not (repo / "feature_store.yaml").is_file():
        raise MissingDataError(f"no rendered Feast repository at {repo}; run the feast apply step first")
    return import_feast().FeatureStore(repo_path=str(repo))


def apply(config: PipelineConfig) -> list[str]:
    """The Airflow-callable ``feast apply`` step: render the repository and register its objects."""
    repo = render_repo(config)
    store = get_store(config)
    objects = feast_objects(load_definitions(repo))
    store.apply(objects)
    names = sorted(f"{type(o).__name__}:{o.name}" for o in objects)
    log.info("feast apply: %d objects in %s", len(names), repo)
    return names


def _utc(value: dt.datetime | dt.date) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time(0, 0))
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def serving_instant(config: PipelineConfig) -> dt.datetime:
    """Where a run's materialization ends (UTC): the source's `served_after` past midnight UTC after
    its last day, when every feature row of that day is in (flights: 06:00, every arrival of it)."""
    midnight = dt.datetime.combine(config.end_date + dt.timedelta(days=1), dt.time(0, 0), tzinfo=dt.UTC)
    return midnight + sources.of(config).served_after


def materialize(
    config: PipelineConfig, end: dt.datetime | dt.date, start: dt.datetime | dt.date | None = None
) -> list[str]:
    """The materialization step: load feature values up to ``end`` into the online store.

    Incremental: each view continues from where its last materialization ended. A view never materialized
    starts at the pipeline's ``start_date`` (Feast's own default, ``now - ttl``, would skip historical
    data). ``start`` forces an explicit window for every view. Returns the names of the views loaded.
    """
    store = get_store(config)
    views = store.list_feature_views()
    if not views:
        raise MissingDataError("no feature views are registered; run the feast apply step first")
    end_utc = _utc(end)
    fresh = [v.name for v in views if start is not None or v.most_recent_end_time is None]
    if fresh:
        begin = _utc(start if start is not None else config.start_date)
        store.materialize(start_date=begin, end_date=end_utc, feature_views=fresh)
    if len(fresh) < len(views):
        store.materialize_incremental(
            end_date=end_utc, feature_views=[v.name for v in views if v.name not in fresh]
        )
    log.info("feast materialize: %d view(s) up to %s", len(views), end_utc.isoformat())
    return sorted(v.name for v in views)


def feature_service(config: PipelineConfig, store: FeatureStore | None = None) -> FeatureService:
    store = store or get_store(config)
    try:
        return store.get_feature_service(config.feature_service)
    except Exception as exc:  # Feast raises FeatureServiceNotFoundException
        raise MissingDataError(
            f"feature service {config.feature_service!r} is not registered; run the feast apply step ({exc})"
        ) from exc


def online_features(config: PipelineConfig, entity_rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Serve the feature service's features for ``entity_rows`` from the online store."""
    store = get_store(config)
    service = feature_service(config, store)
    return store.get_online_features(features=service, entity_rows=entity_rows).to_dict()
