"""Training configuration: immutable dataclasses loaded from a YAML file, with `--set a.b=value` overrides."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration value is missing or breaks a rule; the message names the field."""


@dataclass(frozen=True)
class DataConfig:
    path: str | None = None
    """The parquet training set (any fsspec URL): required by the MLP; the transformer reads no data."""
    label_column: str = "is_delayed"
    feature_columns: tuple[str, ...] | None = None
    val_fraction: float = 0.1


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "mlp"
    """A model kind of `training.workloads.KINDS`: `mlp` (a binary classifier on the parquet training set,
    the flight-delay model), `mlp_regressor` (a regressor on one, the temperature forecast) or
    `transformer` (a decoder-only transformer on synthetic token sequences)."""
    hidden: tuple[int, ...] = (64, 64)
    """The MLPs' hidden widths."""
    dropout: float = 0.0
    vocab: int = 64
    """The transformer's vocabulary, width, attention heads, blocks and sequence length."""
    width: int = 64
    heads: int = 4
    layers: int = 4
    seq_len: int = 16


@dataclass(frozen=True)
class AdaptiveBatchConfig:
    """Opt-in adaptive batch size (training/adaptive.py): every `every_steps` steps the global batch
    becomes the one within [min, max] with the most goodput, measured throughput x statistical
    efficiency, as Pollux chooses it."""

    min: int
    max: int
    every_steps: int = 10
    """Steps between choices (the same steps on every worker)."""
    smoothing: float = 0.9
    """The moving average's weight on the past of the gradient's statistics, per step."""


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 100
    global_batch_size: int = 64
    """Examples per optimizer step over all workers: the same at every size of the gang, which splits
    it (training/batching.py)."""
    micro_batch_size: int | None = None
    """The most examples a worker takes in one forward and backward: a worker whose share of the
    global batch is larger accumulates gradients over micro-batches (the largest divisor of its share
    within this bound). Null: its whole share at once."""
    adaptive_batch: AdaptiveBatchConfig | None = None
    """Null (the default): the global batch stays `global_batch_size`. Set: it starts there and moves
    within the bounds; the learning rate follows it by the square-root rule."""
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 0
    log_every: int = 1
    step_sleep_s: float = 0.0
    """Artificial delay per step; lets tests land a signal mid-run on a tiny model."""


@dataclass(frozen=True)
class ParallelConfig:
    strategy: str = "ddp"
    """`auto`, or a strategy of the model kind: ddp or fsdp for the MLP, a layout of
    `training.layouts.LAYOUTS` for the transformer (ddp, fsdp, tp, pp, fsdp_tp, pp_dp)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    gpu_memory_gb: float | None = None
    """Memory per device for `strategy: auto`; read from the GPU when unset (CPU runs: 16 GB)."""
    tp: int | None = None
    """fsdp_tp: ranks per tensor-parallel group."""
    pp: int | None = None
    """pp_dp: pipeline stages."""
    micro_batches: int | None = None
    """pp, pp_dp: micro-batches per step (default: one per stage)."""
    schedule: str = "1f1b"
    """pp, pp_dp: the pipeline schedule, 1f1b or gpipe."""
    gpus_per_node: int | None = None
    """For the planner (`auto`): devices per node; default LOCAL_WORLD_SIZE, else the world size."""
    intra_node_gbps: float | None = None
    """For the planner: GB/s per device inside a node, and between nodes; default the planner's
    (training.planner.Fleet: NVLink 4, 400 Gb/s InfiniBand)."""
    inter_node_gbps: float | None = None


@dataclass(frozen=True)
class CheckpointConfig:
    url: str | None = None
    """fsspec URL of the checkpoint root; GPUYARD_CHECKPOINT_URL wins, default file://{workdir}/checkpoints."""
    interval_steps: int | None = None
    interval_s: float | Literal["auto"] | None = None
    """Seconds between checkpoints; `auto` takes the control plane's Young/Daly interval."""
    auto_fallback_s: float = 600.0
    """Interval used under `auto` until (or unless) the control plane has sent one."""
    keep_last: int = 2
    keep_best_metric: str | None = "val_loss"
    best_mode: Literal["min", "max"] = "min"
    async_save: bool = False
    verify_checksums: bool = True
    save_final: bool = True
    io_timeout_s: float = 30.0
    """On an object store, the longest wait for the server in one request before it is retried."""


@dataclass(frozen=True)
class HeartbeatConfig:
    interval_s: float = 10.0
    timeout_s: float = 5.0


@dataclass(frozen=True)
class MlflowConfig:
    enabled: bool = True
    tracking_uri: str | None = None
    """MLFLOW_TRACKING_URI wins over this; default sqlite:///{workdir}/mlflow.db."""
    artifact_location: str | None = None
    experiment: str = "gpuyard"
    run_name: str | None = None
    register_model: str | None = None
    log_model: bool = True
    system_metrics: bool = True
    system_metrics_interval_s: float = 5.0


@dataclass(frozen=True)
class Config:
    """The fields and their own rules (`validate`); the rules of the model kind and its strategy are
    `training.workloads.check`'s, which knows the kinds and the layouts."""

    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    workdir: str = ".gpuyard/train"
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def checkpoint_url(self, env: typing.Mapping[str, str] = os.environ) -> str:
        """The launcher's GPUYARD_CHECKPOINT_URL, else the config's, else a folder under the workdir."""
        url = env.get("GPUYARD_CHECKPOINT_URL") or self.checkpoint.url
        return url or Path(self.workdir, "checkpoints").resolve().as_uri()

    def validate(self) -> None:
        t = self.train
        if t.max_steps < 1:
            raise ConfigError(f"train.max_steps: expected >= 1, got {t.max_steps}")
        if t.global_batch_size < 1:
            raise ConfigError(f"train.global_batch_size: expected >= 1, got {t.global_batch_size}")
        if t.micro_batch_size is not None and t.micro_batch_size < 1:
            raise ConfigError(f"train.micro_batch_size: expected >= 1 or null, got {t.micro_batch_size}")
        if t.adaptive_batch is not None:
            _check_adaptive(t.adaptive_batch, t.global_batch_size)
        if not 0.0 <= self.data.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction: expected in [0, 1), got {self.data.val_fraction}")
        c = self.checkpoint
        if c.interval_steps is not None and c.interval_steps < 1:
            raise ConfigError(f"checkpoint.interval_steps: expected >= 1 or null, got {c.interval_steps}")
        if isinstance(c.interval_s, str) and c.interval_s != "auto":
            raise ConfigError(
                f"checkpoint.interval_s: expected seconds, 'auto' or null, got {c.interval_s!r}"
            )
        if c.keep_last < 1:
            raise ConfigError(f"checkpoint.keep_last: expected >= 1, got {c.keep_last}")
        if c.io_timeout_s <= 0:
            raise ConfigError(f"checkpoint.io_timeout_s: expected > 0, got {c.io_timeout_s}")
        p = self.parallel
        for name in ("tp", "pp", "micro_batches", "gpus_per_node"):
            value = getattr(p, name)
            if value is not None and value < 1:
                raise ConfigError(f"parallel.{name}: expected >= 1 or null, got {value}")
        for name in ("gpu_memory_gb", "intra_node_gbps", "inter_node_gbps"):
            value = getattr(p, name)
            if value is not None and value <= 0:
                raise ConfigError(f"parallel.{name}: expected > 0 or null, got {value}")


def _check_adaptive(a: AdaptiveBatchConfig, start: int) -> None:
    if a.min < 1:
        raise ConfigError(f"train.adaptive_batch.min: expected >= 1, got {a.min}")
    if not a.min <= start <= a.max:
        field = "min" if start < a.min else "max"
        raise ConfigError(
            f"train.adaptive_batch.{field}: the bounds must hold train.global_batch_size ({start}), "
            f"the batch a run starts at; got min {a.min}, max {a.max}"
        )
    if a.every_steps < 1:
        raise ConfigError(f"train.adaptive_batch.every_steps: expected >= 1, got {a.every_steps}")
    if not 0.0 <= a.smoothing < 1.0:
        raise ConfigError(f"train.adaptive_batch.smoothing: expected in [0, 1), got {a.smoothing}")


def _build(cls: type, raw: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, checking names and coercing simple types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where or 'config'}: unknown field(s) {unknown}; expected some of {sorted(fields)}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}" if where else name)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where or 'config'}: missing required field(s) {missing}")
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} matches none of {hint} ({'; '.join(errors)})")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(args[0], v, f"{where}[]") for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported type {hint}")


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply `a.b.c=value` (value parsed as YAML) to a raw config mapping, in place."""
    key, sep, text = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"override: expected KEY=VALUE, got {assignment!r}")
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key}: {part} is not a mapping")
    node[parts[-1]] = yaml.safe_load(text)


def from_dict(raw: dict[str, Any]) -> Config:
    config = _build(Config, raw, "")
    config.validate()
    return config


def load(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config file and apply `key=value` overrides."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    if isinstance(raw.get("training"), dict):
        # A pipeline definition (pipelines/flights_delay/pipeline.yaml): its `training:` section is
        # this config, and the pipeline's label column is the default label.
        section = dict(raw["training"])
        data = dict(section.get("data") or {})
        if "label_column" in raw:
            data.setdefault("label_column", raw["label_column"])
        section["data"] = data
        raw = section
    for assignment in overrides:
        apply_override(raw, assignment)
    return from_dict(raw)
