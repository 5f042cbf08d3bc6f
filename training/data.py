"""Training data: a parquet file or folder (any fsspec URL) read into tensors, and a resumable sampler.

The sampler is a pure function of (seed, step): the global batch of step k is the same whatever the number
of workers, and each rank takes an equal slice of it. So the data position saved in a checkpoint is just
the step, and a run resumed on a different world size sees exactly the same samples.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import torch

from training.config import DataConfig


class DataError(ValueError):
    """The training data does not match what the config says."""


@dataclass(frozen=True)
class Dataset:
    features: torch.Tensor
    """float32 [n, d]"""
    labels: torch.Tensor
    """float32 [n]: 0.0 or 1.0 for a classifier, the value for a regressor"""
    feature_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class Split:
    train: Dataset
    val: Dataset


def _manifest_features(fs: Any, root: str) -> list[str] | None:
    """The feature columns a training set's manifest.json (the data plane writes one beside the
    parquet) names: keys such as flight ids are numeric too, and must not become features."""
    directory = root if fs.isdir(root) else root.rsplit("/", 1)[0]
    path = f"{directory}/manifest.json"
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as handle:
        columns = json.load(handle).get("feature_columns")
    return list(columns) if isinstance(columns, list) else None


def read_parquet(cfg: DataConfig, binary: bool = True) -> Dataset:
    """Read every parquet file under `cfg.path`; keep numeric features and the label (0/1 where `binary`,
    else any number); drop null rows."""
    if cfg.path is None:
        raise DataError("data.path: missing required field (the parquet training set)")
    fs, root = fsspec.core.url_to_fs(cfg.path)
    if not fs.exists(root):
        raise DataError(f"data.path: {cfg.path} does not exist")
    files = [root] if fs.isfile(root) else sorted(p for p in fs.find(root) if p.endswith(".parquet"))
    if not files:
        raise DataError(f"data.path: no .parquet files under {cfg.path}")
    table = pads.dataset(files, filesystem=fs, format="parquet").to_table()
    schema = table.schema
    if cfg.label_column not in schema.names:
        raise DataError(f"data.label_column: {cfg.label_column!r} not in columns {schema.names}")
    listed = cfg.feature_columns if cfg.feature_columns is not None else _manifest_features(fs, root)
    if listed is not None:
        missing = [c for c in listed if c not in schema.names]
        if missing:
            raise DataError(f"data.feature_columns: {missing} not in columns {schema.names}")
        names = tuple(listed)
    else:
        names = tuple(
            f.name
            for f in schema
            if f.name != cfg.label_column
            and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type))
        )
    if not names:
        raise DataError(f"data: no numeric feature columns besides the label in {schema.names}")
    for name in (*names, cfg.label_column):
        t = schema.field(name).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise DataError(f"data: column {name!r} is {t}, expected a numeric or boolean column")
    columns = [table.column(n).to_numpy(zero_copy_only=False).astype(np.float64) for n in names]
    label = table.column(cfg.label_column).to_numpy(zero_copy_only=False).astype(np.float64)
    x = np.stack(columns, axis=1) if columns else np.zeros((len(label), 0))
    keep = ~(np.isnan(x).any(axis=1) | np.isnan(label))
    x, label = x[keep], label[keep]
    bad = set(np.unique(label).tolist()) - {0.0, 1.0} if binary else set()
    if bad:
        raise DataError(
            f"data.label_column {cfg.label_column!r}: expected 0/1 or booleans, found {sorted(bad)[:5]}"
        )
    if len(label) == 0:
        raise DataError(f"data: no rows left in {cfg.path} after dropping nulls")
    return Dataset(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(label.astype(np.float32)), names)


def split(data: Dataset, val_fraction: float, seed: int) -> Split:
    """A deterministic train/validation split (the same on every rank)."""
    n = len(data)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed ^ 0x5EED))
    n_val = int(n * val_fraction)
    val_idx, train_idx = order[:n_val].sort().values, order[n_val:].sort().values
    if len(train_idx) == 0:
        raise DataError(f"data: {n} rows leave no training rows at val_fraction={val_fraction}")

    def take(idx: torch.Tensor) -> Dataset:
        return Dataset(data.features[idx], data.labels[idx], data.feature_names)

    return Split(take(train_idx), take(val_idx))


class StepSampler:
    """Indices of each step's batch: epoch-wise shuffles of the training set, read as one endless stream."""

    def __init__(
        self, n: int, global_batch_size: int, seed: int, first_step: int = 0, first_position: int = 0
    ) -> None:
        """`first_position`: where in the stream step `first_step` starts (an adaptive batch's change
        of size re-anchors the stream where the steps before it left it)."""
        self.n = n
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.first_step = first_step
        self.first_position = first_position
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=g)
        return self._perms[epoch]

    def global_batch(self, step: int) -> torch.Tensor:
        """Indices of the samples consumed by step `step` (0-based), across all ranks."""
        start = self.first_position + (step - self.first_step) * self.global_batch_size
        positions = torch.arange(start, start + self.global_batch_size)
        epochs, offsets = positions // self.n, positions % self.n
        out = torch.empty(self.global_batch_size, dtype=torch.long)
        for epoch in epochs.unique().tolist():
            mask = epochs == epoch
            out[mask] = self._perm(int(epoch))[offsets[mask]]
        return out

    def local_batch(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        if self.global_batch_size % world_size:
            raise DataError(
                f"train.global_batch_size {self.global_batch_size} is not divisible by world size "
                f"{world_size}"
            )
        per_rank = self.global_batch_size // world_size
        return self.global_batch(step)[rank * per_rank : (rank + 1) * per_rank]


def feature_stats(train: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of each feature (std 1 for constant columns)."""
    mean = train.features.mean(dim=0)
    std = train.features.std(dim=0, unbiased=False)
    return mean, torch.where(std > 0, std, torch.ones_like(std))


def write_synthetic(
    path: str, rows: int, features: int = 6, seed: int = 0, label: str = "is_delayed"
) -> None:
    """Write a synthetic flights-like parquet file (tests, benchmarks, demos): numeric features, a label."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float64)
    w = rng.normal(size=features)
    logits = x @ w + 0.5 * np.sin(3 * x[:, 0])
    y = (logits + rng.normal(scale=0.5, size=rows)) > 0.0
    cols: dict[str, np.ndarray] = {f"f{i}": x[:, i] for i in range(features)}
    cols[label] = y
    with fsspec.open(path, "wb") as fh:
        pq.write_table(pa.table(cols), fh)
