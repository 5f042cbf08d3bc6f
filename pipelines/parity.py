"""Training/serving parity: the candidate model sees online exactly what its training set gave it.

A sample of the evaluation period's rows (entities whose features are still served at the end of the
run's materialization, `features.serving_instant`) is read twice at that instant: from the online
store, as a serving path reads it (`get_online_features` of the feature service), and through the
offline point-in-time join that builds training sets. Both go through the training set's own policy
(its manifest's column order and fill values) and are scored by the candidate model loaded from
MLflow. Any difference in a feature value or a prediction fails the step, naming the row (its source's
key), the entity that keys the feature, the feature and both values; publication waits for this step.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from pipelines import features, sources, storage, training_set
from pipelines.config import PipelineConfig
from pipelines.errors import DataPipelineError, MissingDataError

SAMPLE = 200
FEATURE_TOLERANCE = 1e-9
PREDICTION_TOLERANCE = 1e-6
SHOWN = 10


class ParityFailed(DataPipelineError):
    """Online and offline disagree; the message names every disagreement (the first few in full)."""

    def __init__(self, mismatches: Sequence[str], compared: int) -> None:
        self.mismatches = list(mismatches)
        lines = "\n".join(f"  - {m}" for m in mismatches[:SHOWN])
        more = f"\n  ... and {len(mismatches) - SHOWN} more" if len(mismatches) > SHOWN else ""
        super().__init__(
            f"training/serving parity failed: {len(mismatches)} difference(s) over {compared} rows:\n"
            f"{lines}{more}"
        )


@dataclass(frozen=True)
class ParityReport:
    rows: int
    features: int
    as_of: str
    max_feature_diff: float
    max_prediction_diff: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        return {
            "parity_rows": float(self.rows),
            "parity_max_feature_diff": self.max_feature_diff,
            "parity_max_prediction_diff": self.max_prediction_diff,
        }


def _same(online: Any, offline: Any) -> tuple[bool, float]:
    """Equal within the tolerance (both missing counts as equal); and the absolute difference."""
    missing_on = online is None or (isinstance(online, float) and math.isnan(online))
    missing_off = offline is None or pd.isna(offline)
    if missing_on or missing_off:
        return missing_on and missing_off, 0.0
    diff = abs(float(online) - float(offline))
    return diff <= FEATURE_TOLERANCE * max(1.0, abs(float(offline))), diff


def _shown(value: Any) -> str:
    """A value as a person reads it: numpy's scalars as the Python values they hold (not np.float64(...))."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def compare(
    entities: pd.DataFrame,
    online: Mapping[str, Sequence[Any]],
    offline: pd.DataFrame,
    keys: Mapping[str, str],
    key_column: str,
) -> tuple[list[str], float]:
    """Feature by feature, row by row (rows aligned, each named by its ``key_column``); ``keys`` names
    each feature's join key."""
    mismatches, worst = [], 0.0
    for i, row in enumerate(entities[key_column]):
        for feature, key in keys.items():
            same, diff = _same(online[feature][i], offline[feature].iloc[i])
            worst = max(worst, diff)
            if not same:
                mismatches.append(
                    f"{key_column} {row} ({key}={entities[key].iloc[i]}): {feature} online "
                    f"{_shown(online[feature][i])} != offline {_shown(offline[feature].iloc[i])}"
                )
    return mismatches, worst


def sample_entities(config: PipelineConfig, as_of: dt.datetime, size: int, seed: int) -> pd.DataFrame:
    """Rows of the run's last day still served at ``as_of`` (their views' TTL), sampled."""
    day = config.end_date
    labels = storage.read_partitions(storage.join(config.data_root, "prepared", "labels"), [day], "labels")
    source = sources.of(config)
    frame = labels[[*source.entity_columns, "event_timestamp"]].copy()
    for column, value in source.entity_fill.items():
        frame[column] = frame[column].fillna(value)
    served = frame[
        pd.to_datetime(frame["event_timestamp"], utc=True) > pd.Timestamp(as_of) - pd.Timedelta(days=1)
    ]
    if served.empty:
        raise MissingDataError(
            f"no {source.key_column} of {day} is still served at {as_of.isoformat()}: nothing to compare"
        )
    picked = served.sample(n=min(size, len(served)), random_state=seed)
    return picked.sort_values(source.key_column).reset_index(drop=True)


def _matrix(values: Mapping[str, Sequence[Any]] | pd.DataFrame, manifest: Mapping[str, Any]) -> np.ndarray:
    """The model's input as the training set made it: manifest column order, its fill values."""
    columns = manifest["feature_columns"]
    frame = pd.DataFrame({c: pd.to_numeric(pd.Series(list(values[c])), errors="coerce") for c in columns})
    return frame.fillna(manifest["fill_values"]).to_numpy(dtype="float32")


def check(
    config: PipelineConfig,
    model_uri: str,
    train_manifest_url: str,
    tracking_uri: str,
    size: int = SAMPLE,
    seed: int = 0,
) -> ParityReport:
    """Compare online and offline features and the candidate's predictions on them; raise on a difference."""
    import mlflow.pyfunc

    fs, path = storage.filesystem(train_manifest_url)
    with fs.open(path) as handle:
        manifest = json.load(handle)
    store = features.get_store(config)
    service = features.feature_service(config, store)
    keys = {
        f.name: store.get_feature_view(p.name).join_keys[0]
        for p in service.feature_view_projections
        for f in p.features
    }
    if sorted(keys) != sorted(manifest["feature_columns"]):
        raise ParityFailed(
            [
                f"the service serves {sorted(keys)}, "
                f"the training set has {sorted(manifest['feature_columns'])}"
            ],
            0,
        )
    as_of = features.serving_instant(config)
    entities = sample_entities(config, as_of, size, seed)
    source = sources.of(config)
    rows = entities[list(source.entity_columns)].to_dict("records")
    online = store.get_online_features(features=service, entity_rows=rows).to_dict()
    offline_df = entities[list(source.entity_columns)].assign(event_timestamp=pd.Timestamp(as_of))
    offline = training_set.historical_features(config, offline_df, service)
    key = source.key_column
    offline = offline.set_index(key).loc[entities[key]].reset_index()
    mismatches, worst = compare(entities, online, offline, keys, key)
    mlflow.set_tracking_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    served = np.asarray(model.predict(_matrix(online, manifest)), dtype="float64").reshape(-1)
    trained = np.asarray(model.predict(_matrix(offline, manifest)), dtype="float64").reshape(-1)
    gaps = np.abs(served - trained)
    for i in np.flatnonzero(gaps > PREDICTION_TOLERANCE):
        mismatches.append(
            f"{key} {entities[key].iloc[i]}: prediction online {served[i]:.6f} != offline {trained[i]:.6f}"
        )
    if mismatches:
        raise ParityFailed(mismatches, len(entities))
    return ParityReport(
        rows=len(entities),
        features=len(keys),
        as_of=as_of.isoformat(),
        max_feature_diff=worst,
        max_prediction_diff=float(gaps.max()) if len(gaps) else 0.0,
    )
