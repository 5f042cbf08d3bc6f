"""Config loading and the data path: parquet reading, split, and the world-size-independent sampler."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training.config import ConfigError, DataConfig, from_dict, load
from training.data import DataError, StepSampler, read_parquet, split
from training.model import Rescaled
from training.workloads import check


def test_load_with_overrides_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data: {path: /d}\ntrain: {max_steps: 5}\ncheckpoint: {interval_s: auto}\n")
    cfg = load(path, ["train.max_steps=7", "model.hidden=[4, 2]", "checkpoint.async_save=true"])
    assert cfg.train.max_steps == 7 and cfg.model.hidden == (4, 2) and cfg.checkpoint.async_save
    assert cfg.checkpoint.interval_s == "auto"
    assert cfg.checkpoint_url({}).startswith("file://") and cfg.checkpoint_url({}).endswith("/checkpoints")
    assert cfg.checkpoint_url({"GPUYARD_CHECKPOINT_URL": "s3://b/ckpt"}) == "s3://b/ckpt"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "missing required field"),
        ({"data": {"path": "/d"}, "train": {"max_steps": 0}}, "train.max_steps"),
        ({"data": {"path": "/d"}, "trian": {}}, "unknown field"),
        ({"data": {"path": "/d"}, "checkpoint": {"interval_s": "often"}}, "checkpoint.interval_s"),
        ({"data": {"path": "/d"}, "parallel": {"strategy": "zero"}}, "parallel.strategy"),
        ({"data": {"path": "/d"}, "train": {"lr": "fast"}}, "train.lr"),
        ({"data": {"path": "/d"}, "checkpoint": {"io_timeout_s": 0}}, "checkpoint.io_timeout_s"),
    ],
)
def test_invalid_configs_name_the_field(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check(from_dict(raw))  # the fields' rules, then the model kind's and its strategy's


def test_reads_a_folder_of_parquet_files_and_drops_nulls(tmp_path: Path) -> None:
    for i in range(2):
        pq.write_table(
            pa.table(
                {
                    "dep_delay": [1.0, None, 3.0],
                    "distance": [100, 200, 300],
                    "carrier": ["AA", "UA", "DL"],
                    "is_delayed": [True, False, i == 1],
                }
            ),
            tmp_path / f"part-{i}.parquet",
        )
    data = read_parquet(DataConfig(path=str(tmp_path)))
    assert data.feature_names == ("dep_delay", "distance")  # the string column is not a feature
    assert len(data) == 4 and data.labels.tolist() == [1.0, 0.0, 1.0, 1.0]
    chosen = read_parquet(DataConfig(path=str(tmp_path), feature_columns=("distance",)))
    assert chosen.features.shape == (6, 1)


def test_bad_labels_and_missing_columns_are_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1.0, 2.0], "arr_delay": [3.0, 40.0]}), tmp_path / "d.parquet")
    with pytest.raises(DataError, match="expected 0/1"):
        read_parquet(DataConfig(path=str(tmp_path / "d.parquet"), label_column="arr_delay"))
    with pytest.raises(DataError, match="not in columns"):
        read_parquet(DataConfig(path=str(tmp_path / "d.parquet"), label_column="is_delayed"))
    # a regressor's label is any number
    values = read_parquet(
        DataConfig(path=str(tmp_path / "d.parquet"), label_column="arr_delay"), binary=False
    )
    assert values.labels.tolist() == [3.0, 40.0]


def test_a_regressor_is_served_in_its_label_s_units() -> None:
    network = torch.nn.Linear(2, 1)
    with torch.no_grad():
        network.weight.copy_(torch.tensor([[1.0, -1.0]]))
        network.bias.zero_()
    served = Rescaled(StandardOutput(network), mean=12.0, std=4.0)
    assert served(torch.tensor([[1.5, 0.5], [0.0, 0.0]])).tolist() == [16.0, 12.0]
    with pytest.raises(ConfigError, match=r"data\.path: missing required field: model\.kind mlp_regressor"):
        check(from_dict({"model": {"kind": "mlp_regressor"}}))


class StandardOutput(torch.nn.Module):
    """A network with one output per row, as the MLP returns it."""

    def __init__(self, linear: torch.nn.Module) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(-1)


def test_split_is_deterministic_and_disjoint(flights_parquet: Path) -> None:
    data = read_parquet(DataConfig(path=str(flights_parquet)))
    a, b = split(data, 0.2, seed=1), split(data, 0.2, seed=1)
    assert torch.equal(a.val.features, b.val.features)
    assert len(a.train) + len(a.val) == len(data) and len(a.val) == int(len(data) * 0.2)


def test_sampler_global_batch_is_independent_of_world_size() -> None:
    sampler = StepSampler(n=50, global_batch_size=8, seed=3)
    for step in (0, 6, 7, 13):  # step 6 crosses an epoch boundary (48..55 of a 50-row stream)
        whole = sampler.local_batch(step, 0, 1)
        halves = torch.cat([sampler.local_batch(step, r, 2) for r in range(2)])
        quarters = torch.cat([sampler.local_batch(step, r, 4) for r in range(4)])
        assert torch.equal(whole, halves) and torch.equal(whole, quarters)
    first_six = torch.cat([sampler.global_batch(s) for s in range(6)]).tolist()
    epoch0 = first_six + sampler.global_batch(6)[:2].tolist()
    assert sorted(epoch0) == list(range(50))  # every row once per epoch
    assert not torch.equal(sampler.global_batch(0), StepSampler(50, 8, seed=4).global_batch(0))
    with pytest.raises(DataError, match="not divisible"):
        sampler.local_batch(0, 0, 3)
