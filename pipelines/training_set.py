"""Training-set step: point-in-time join of labels and feature service, written as parquet + manifest.

The labels of ``training_start_date..training_end_date`` (the source's ``prepared/labels``) are the
entity rows; Feast's ``get_historical_features`` attaches, for each label, the newest feature row at or
before the label's ``event_timestamp`` (for flights, the scheduled departure) within each view's TTL.
Missing values are filled with the column median of this training set (recorded in the manifest).
Output, under ``<data_root>/training/<feature_service>/<start>_<end>/``: ``data.parquet`` (the
source's key column, ``event_timestamp``, numeric feature columns, the label: an integer 0/1 for a
source of binary labels, else a float) and ``manifest.json``, written last.
A run builds two: the training labels and its held-out days (the same join, later dates).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import features, sources, storage
from pipelines.config import PipelineConfig
from pipelines.errors import DataPipelineError
from spark_jobs import layout

if TYPE_CHECKING:
    from feast import FeatureService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingSet:
    """Where the training set was written and what its manifest says."""

    data_url: str
    manifest_url: str
    manifest: dict[str, Any]
    build_seconds: float


def feature_columns(service: FeatureService) -> list[str]:
    return [f.name for projection in service.feature_view_projections for f in projection.features]


def service_fingerprint(service: FeatureService) -> str:
    """A digest of what the service serves (views, features, types); changes when a definition changes."""
    spec = [
        [projection.name, sorted((f.name, str(f.dtype)) for f in projection.features)]
        for projection in sorted(service.feature_view_projections, key=lambda p: p.name)
    ]
    return "sha256:" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def snapshot_id(frame: pd.DataFrame) -> str:
    """A content digest of the training rows: the same inputs give the same id, any change a new one."""
    hashed = pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes()
    return "sha256:" + hashlib.sha256(hashed).hexdigest()[:16]


def entity_frame(config: PipelineConfig, start: dt.date, end: dt.date) -> pd.DataFrame:
    """The labels of ``start..end`` as Feast's entity rows: the source's entity columns, the time, the
    label and the day."""
    source = sources.of(config)
    labels_url = storage.join(config.data_root, "prepared", "labels")
    labels = storage.read_partitions(labels_url, layout.days(start, end), "labels")
    # `date` (the label's local day) rides along through the join: it splits the parts afterwards.
    frame = labels[[*source.entity_columns, "event_timestamp", config.label_column, "date"]].copy()
    for column, value in source.entity_fill.items():
        frame[column] = frame[column].fillna(value)
    frame["event_timestamp"] = pd.to_datetime(frame["event_timestamp"], utc=True)
    return frame.sort_values(["event_timestamp", source.key_column]).reset_index(drop=True)


def historical_features(
    config: PipelineConfig, entity_df: pd.DataFrame, service: FeatureService | None = None
) -> pd.DataFrame:
    """Point-in-time correct features for ``entity_df`` (raw Feast output, nulls kept)."""
    store = features.get_store(config)
    service = service or features.feature_service(config, store)
    return store.get_historical_features(entity_df=entity_df, features=service).to_df()


def build_training_set(
    config: PipelineConfig,
    start: dt.date | None = None,
    end: dt.date | None = None,
    output_url: str | None = None,
) -> TrainingSet:
    """The point-in-time join for the labels of ``start..end`` (default: the config's training dates).
    `validate.validate_training_set` checks what it wrote."""
    start, end = start or config.training_start_date, end or config.training_end_date
    return build_training_sets(config, {"train": (start, end)}, output_urls={"train": output_url})["train"]


def build_training_sets(
    config: PipelineConfig,
    parts: Mapping[str, tuple[dt.date, dt.date]],
    output_urls: Mapping[str, str | None] | None = None,
) -> dict[str, TrainingSet]:
    """One point-in-time join for the labels of every part (e.g. the training days and the held-out
    days after them), written as one set each. The first part's medians fill the missing values of
    every part, as serving would: a held-out part never informs its own fill."""
    store = features.get_store(config)
    service = features.feature_service(config, store)
    columns = feature_columns(service)
    label = config.label_column
    started = time.perf_counter()
    first = min(s for s, _ in parts.values())
    last = max(e for _, e in parts.values())
    entity_df = entity_frame(config, first, last)
    log.info("training sets: %d labels %s..%s, %d features", len(entity_df), first, last, len(columns))
    joined = historical_features(config, entity_df, service)
    missing = [c for c in (*columns, label) if c not in joined.columns]
    if missing:
        raise DataPipelineError(f"Feast returned no column(s) {missing} for feature service {service.name!r}")
    joined = joined.sort_values(["event_timestamp", sources.of(config).key_column]).reset_index(drop=True)
    for column in columns:
        joined[column] = pd.to_numeric(joined[column], errors="coerce").astype("float64")
    built: dict[str, TrainingSet] = {}
    fills: dict[str, float] | None = None
    for name, (start, end) in parts.items():
        part = joined[(joined["date"] >= start.isoformat()) & (joined["date"] <= end.isoformat())]
        if fills is None:
            medians = part[columns].median()
            fills = {c: float(medians[c]) if pd.notna(medians[c]) else 0.0 for c in columns}
        url = (output_urls or {}).get(name) or storage.join(
            config.data_root, "training", service.name, f"{start.isoformat()}_{end.isoformat()}"
        )
        built[name] = _write(
            config, service, part, columns, fills, start, end, url, time.perf_counter() - started
        )
    return built


def _write(
    config: PipelineConfig,
    service: FeatureService,
    joined: pd.DataFrame,
    columns: list[str],
    fills: Mapping[str, float],
    start: dt.date,
    end: dt.date,
    output_url: str,
    build_seconds: float,
) -> TrainingSet:
    source = sources.of(config)
    label = config.label_column
    null_counts = {c: int(joined[c].isna().sum()) for c in columns}
    data = joined[[source.key_column, "event_timestamp"]].copy()
    for column in columns:
        data[column] = joined[column].fillna(fills[column])
    binary = source.binary_label
    data[label] = joined[label].astype("int64" if binary else "float64")
    fs, path = storage.filesystem(output_url)
    fs.makedirs(path, exist_ok=True)
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(data.reset_index(drop=True), preserve_index=False), buffer)
    with fs.open(f"{path}/data.parquet", "wb") as handle:
        handle.write(buffer.getvalue())
    manifest = {
        "format": "parquet",
        "data_file": "data.parquet",
        "row_count": len(data),
        "label_column": label,
        "label_definition": source.label_definition(config),
        "positive_rate": float(data[label].mean()) if binary and len(data) else None,
        "feature_columns": columns,
        "key_columns": [source.key_column, "event_timestamp"],
        "source": source.name,
        "feature_service": {
            "name": service.name,
            "version": service.tags.get("version", "unversioned"),
            "fingerprint": service_fingerprint(service),
            "features": [f"{p.name}:{f.name}" for p in service.feature_view_projections for f in p.features],
        },
        "data_snapshot_id": snapshot_id(data.reset_index(drop=True)),
        "label_dates": {"start": start.isoformat(), "end": end.isoformat()},
        "fill_values": dict(fills),
        "null_counts_before_fill": null_counts,
        "data_root": config.data_root,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    with fs.open(f"{path}/manifest.json", "w") as handle:
        handle.write(json.dumps(manifest, indent=2) + "\n")
    log.info("training set: %d rows %s..%s -> %s", len(data), start, end, output_url)
    return TrainingSet(
        storage.join(output_url, "data.parquet"),
        storage.join(output_url, "manifest.json"),
        manifest,
        build_seconds,
    )
