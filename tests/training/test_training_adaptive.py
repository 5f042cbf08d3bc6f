"""Adaptive batch size (`train.adaptive_batch`, training/adaptive.py): the gradient-noise estimate, the
goodput choice, the config's rules, and a real run whose batch moves within its bounds and resumes,
resized, with the batch and the noise average its checkpoint holds."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from trainkit import read_events, run_workers, write_config

from training import exit_codes, workloads
from training.adaptive import AdaptiveBatch, StepCost, candidates, choose
from training.batching import split
from training.checkpoint import CheckpointStore
from training.config import AdaptiveBatchConfig, ConfigError, from_dict
from training.data import StepSampler
from training.efficiency import GradStats, NoiseAverage, estimate, gain
from training.trainer import lr_lambda


def test_the_noise_estimate_recovers_a_known_gradient_mean_and_variance() -> None:
    """Piece gradients of b examples drawn around a known mean with a known per-example variance
    (trace sigma^2): the estimate gives |mean|^2 and sigma^2 / M0, and so does its moving average."""
    g = torch.Generator().manual_seed(0)
    dim, pieces, piece_batch, init_batch, sigma2 = 4000, 8, 4, 16, 50.0
    mean = torch.full((dim,), 0.05, dtype=torch.float64)  # |mean|^2 = 10
    average = NoiseAverage()
    for _ in range(30):
        spread = math.sqrt(sigma2 / dim / piece_batch)  # each coordinate's, in a piece's mean
        grads = mean + torch.randn(pieces, dim, generator=g, dtype=torch.float64) * spread
        piece_sqr = float(grads.square().sum(dim=1).mean())
        mean_sqr = float(grads.mean(dim=0).square().sum())
        sample = estimate(piece_sqr, mean_sqr, pieces, piece_batch, init_batch)
        average = average.add(sample, 0.9)
    found = average.stats()
    assert found is not None
    assert found.sqr == pytest.approx(10.0, rel=0.05)
    assert found.var == pytest.approx(sigma2 / init_batch, rel=0.05)
    with pytest.raises(ValueError, match=r"^pieces: the noise needs at least 2"):
        estimate(1.0, 1.0, 1, 4, 16)


def test_the_gain_is_the_batch_where_noise_dominates_and_one_where_signal_does() -> None:
    assert gain(1.0, 3.0, 5.0) == 1.0
    assert gain(8.0, 0.0, 1.0) == 8.0
    assert gain(8.0, 1.0, 0.0) == 1.0


def test_the_choice_grows_the_batch_where_noise_is_high_and_stays_at_the_min_where_low() -> None:
    bounds = AdaptiveBatchConfig(min=8, max=128)
    assert candidates(bounds, 8) == [8, 16, 32, 64, 128]
    assert candidates(AdaptiveBatchConfig(min=8, max=100), 24) == [8, 16, 24, 32, 64, 100]
    splits = [split(b, 2, 4) for b in candidates(bounds, 8)]
    cost = StepCost(fixed_s=1.0, per_example_s=0.001)  # a step's fixed cost dominates
    assert choose(splits, cost, GradStats(sqr=1.0, var=100.0), start=8) == 128
    assert choose(splits, cost, GradStats(sqr=1.0, var=0.001), start=8) == 8
    assert choose(splits, cost, None, start=8) is None  # nothing measured: the batch stays
    # Where compute dominates, a larger batch's throughput gain is small: a moderate noise stays small.
    assert choose(splits, StepCost(0.01, 1.0), GradStats(sqr=1.0, var=2.0), start=8) == 8


def flights(path: Path, **train: Any) -> dict[str, Any]:
    return {"data": {"path": str(path)}, "train": {"global_batch_size": 16, **train}}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"adaptive_batch": {"min": 32, "max": 64}},
            r"^train.adaptive_batch.min: the bounds must hold train.global_batch_size \(16\)",
        ),
        (
            {"adaptive_batch": {"min": 8, "max": 12}},
            r"^train.adaptive_batch.max: the bounds must hold train.global_batch_size \(16\)",
        ),
        ({"adaptive_batch": {"min": 0, "max": 64}}, r"^train.adaptive_batch.min: expected >= 1, got 0$"),
        (
            {"adaptive_batch": {"min": 8, "max": 64, "every_steps": 0}},
            r"^train.adaptive_batch.every_steps: expected >= 1",
        ),
        (
            {"adaptive_batch": {"min": 8, "max": 64, "smoothing": 1.0}},
            r"^train.adaptive_batch.smoothing: expected in \[0, 1\)",
        ),
        ({"adaptive_batch": {"max": 64}}, r"^train.adaptive_batch: .*missing required field\(s\) \['min'\]"),
    ],
)
def test_bad_bounds_are_refused_naming_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(flights(Path("/d"), **raw))


def test_bounds_split_over_the_workers_and_only_the_mlp_on_ddp_takes_them() -> None:
    with pytest.raises(
        ConfigError, match=r"^train.adaptive_batch.max: 30 does not split over 4 data-parallel"
    ):
        AdaptiveBatch(AdaptiveBatchConfig(min=8, max=30), 16, 4, None)
    adaptive = {"adaptive_batch": {"min": 8, "max": 64}}
    transformer = from_dict(
        {"model": {"kind": "transformer"}, "train": {"global_batch_size": 16, **adaptive}}
    )
    with pytest.raises(ConfigError, match=r"^train.adaptive_batch: model.kind transformer trains at a fixed"):
        workloads.check(transformer)
    sharded = from_dict({**flights(Path("/d"), **adaptive), "parallel": {"strategy": "fsdp"}})
    with pytest.raises(ConfigError, match=r"^parallel.strategy: train.adaptive_batch measures"):
        workloads.check(sharded)
    assert from_dict(flights(Path("/d"))).train.adaptive_batch is None  # off by default


def test_a_sampler_anchored_where_the_stream_stands_continues_it() -> None:
    whole = StepSampler(50, 8, seed=4)
    anchored = StepSampler(50, 8, seed=4, first_step=3, first_position=24)
    assert torch.equal(anchored.global_batch(5), whole.global_batch(5))
    larger = StepSampler(50, 16, seed=4, first_step=3, first_position=24)
    assert torch.equal(larger.global_batch(3), torch.cat([whole.global_batch(3), whole.global_batch(4)]))


def trainer_state(work: Path, step: int) -> dict[str, Any]:
    store = CheckpointStore((work / "checkpoints").as_uri())
    found = next(m for m in store.complete() if m.step == step)
    with store.fs.open(f"{store.step_path(step, found.writer_token)}/trainer.pt", "rb") as fh:
        state: dict[str, Any] = torch.load(fh, weights_only=False)
    return state


def test_a_run_moves_its_batch_within_the_bounds_and_resumes_resized_with_it(
    tmp_path: Path, flights_parquet: Path
) -> None:
    """2 workers train 8 steps from a batch of 8 (micro-batches of at most 2: 4 gradients a step to
    measure the noise from), choosing every 4 steps within [8, 128]; the noise of a fresh MLP's
    small batches is far above its gradient's square, so the first choice grows the batch. Resumed on
    1 worker to step 12, the run starts at the batch and the noise average its step-8 checkpoint
    holds, at the learning rate of that batch."""
    bounds = {"min": 8, "max": 128, "every_steps": 4}
    cfg, work = write_config(
        tmp_path,
        flights_parquet,
        "adaptive",
        model={"dropout": 0.0},
        train={"max_steps": 8, "global_batch_size": 8, "micro_batch_size": 2, "adaptive_batch": bounds},
        checkpoint={"interval_steps": 4},
    )
    assert run_workers(cfg, 2, work) == [exit_codes.SUCCESS] * 2
    first = read_events(work)
    batches = [e["global_batch"] for e in first if e["event"] == "step"]
    assert batches[:4] == [8] * 4 and batches[4] > 8
    assert all(8 <= b <= 128 for b in batches)
    chosen = [e for e in first if e["event"] == "batch"]
    assert chosen[0]["after_step"] == 4 and chosen[0]["global_batch"] == batches[4]
    saved = trainer_state(work, 8)["adaptive"]
    held = saved["global_batch"]
    assert saved["noise"][2] == pytest.approx(1 - 0.9**8)  # the average's weight after 8 steps

    assert run_workers(cfg, 1, work, overrides=["train.max_steps=12"]) == [exit_codes.SUCCESS]
    second = read_events(work)[len(first) :]
    start = next(e for e in second if e["event"] == "start")
    assert (start["world_size"], start["global_batch"]) == (1, held)
    steps = {e["step"]: e for e in second if e["event"] == "step"}
    assert steps[9]["global_batch"] == steps[10]["global_batch"] == held
    # The rate of step 9 is the one the checkpoint's optimizer holds (the 8-step schedule's end), of
    # step 10 the 12-step schedule's: each x sqrt(batch / 8), the square-root rule.
    raw = yaml.safe_load(cfg.read_text())
    for step, max_steps in ((9, 8), (10, 12)):
        schedule = lr_lambda(from_dict({**raw, "train": {**raw["train"], "max_steps": max_steps}}))
        assert steps[step]["lr"] == pytest.approx(0.01 * schedule(step - 1) * math.sqrt(held / 8), rel=1e-9)
    assert trainer_state(work, 12)["adaptive"]["noise"][2] == pytest.approx(1 - 0.9**12)  # continued
