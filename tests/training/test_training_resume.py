"""Exact resume: a run preempted by SIGTERM and resumed ends where an uninterrupted run ends."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from trainkit import launch, losses, read_events, run_workers, write_config, write_flights

from training import exit_codes
from training.checkpoint import CheckpointStore, read_model_state

pytestmark = pytest.mark.slow

MAX_STEPS = 10


def final_weights(workdir: Path) -> dict[str, torch.Tensor]:
    store = CheckpointStore((workdir / "checkpoints").as_uri())
    latest = store.latest()
    assert latest is not None and latest.step == MAX_STEPS
    return read_model_state(store.step_url(latest.step))


def baseline(tmp_path: Path, data: Path, strategy: str, nproc: int, dropout: float = 0.1) -> Path:
    """An uninterrupted run; its periodic checkpoints (steps 4 and 8) are asynchronous."""
    cfg, work = write_config(
        tmp_path,
        data,
        f"baseline-{strategy}-{nproc}",
        parallel={"strategy": strategy},
        model={"dropout": dropout},
        checkpoint={"async_save": True},
    )
    assert run_workers(cfg, nproc, work) == [exit_codes.SUCCESS] * nproc
    return work


def preempt_then_resume(
    tmp_path: Path, data: Path, strategy: str, first: int, second: int, dropout: float = 0.1
) -> Path:
    cfg, work = write_config(
        tmp_path,
        data,
        f"resumed-{strategy}-{first}-{second}",
        parallel={"strategy": strategy},
        train={"step_sleep_s": 0.25},
        model={"dropout": dropout},
    )
    workers = launch(cfg, first, work)
    workers.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 5 for e in ev))
    workers.signal(signal.SIGTERM)
    assert workers.wait() == [exit_codes.PREEMPTED] * first, workers.output()
    events = read_events(work)
    stopped = next(e for e in events if e["event"] == "exit")
    assert stopped["code"] == exit_codes.PREEMPTED and 5 <= stopped["step"] < MAX_STEPS
    assert events[-2]["event"] == "checkpoint" and events[-2]["step"] == stopped["step"]
    assert run_workers(cfg, second, work, overrides=["train.step_sleep_s=0"]) == [exit_codes.SUCCESS] * second
    resume = next(e for e in read_events(work) if e["event"] == "resume")
    assert resume["step"] == stopped["step"] and resume["saved_world_size"] == first
    return work


def assert_same_run(reference: Path, resumed: Path, atol: float) -> None:
    ref_w, res_w = final_weights(reference), final_weights(resumed)
    assert ref_w.keys() == res_w.keys()
    for name in ref_w:
        torch.testing.assert_close(res_w[name], ref_w[name], atol=atol, rtol=0, msg=name)
    ref_l, res_l = losses(read_events(reference)), losses(read_events(resumed))
    assert sorted(res_l) == list(range(1, MAX_STEPS + 1))
    for step in range(1, MAX_STEPS + 1):
        assert res_l[step] == pytest.approx(ref_l[step], abs=atol), f"loss at step {step}"
    # The weights really moved: the comparison is not between two untouched models.
    first = CheckpointStore((reference / "checkpoints").as_uri())
    assert ref_l[1] != ref_l[MAX_STEPS] and first.latest() is not None


References = dict[tuple[str, float], Path]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> References:
    """Uninterrupted 2-worker runs, made on first use per (strategy, dropout) and shared by the tests,
    on a copy of the tests' data set of their own (the same rows as each test's `flights_parquet`)."""
    data = write_flights(tmp_path_factory.mktemp("ref-data") / "flights.parquet")

    class Lazy(dict[tuple[str, float], Path]):
        def __missing__(self, key: tuple[str, float]) -> Path:
            self[key] = baseline(tmp_path_factory.mktemp("ref"), data, key[0], 2, key[1])
            return self[key]

    return Lazy()


@pytest.mark.parametrize(("strategy", "dropout"), [("ddp", 0.1), ("fsdp", 0.0)])
def test_preempted_run_resumes_exactly_on_two_workers(
    tmp_path: Path,
    flights_parquet: Path,
    references: References,
    strategy: str,
    dropout: float,
) -> None:
    """Same world size: bit-for-bit the same trajectory (with dropout, every rank's RNG is restored)."""
    reference = references[strategy, dropout]
    store = CheckpointStore((reference / "checkpoints").as_uri())
    manifest = store.read_manifest(8)  # written by the background thread of an asynchronous save
    assert manifest is not None and store.verify(manifest, checksums=True) is None
    per_rank = {"rng/rank-0.pt", "rng/rank-1.pt", "state/__0_0.distcp", "state/__1_0.distcp"}
    assert per_rank <= set(manifest.files)
    resumed = preempt_then_resume(tmp_path, flights_parquet, strategy, 2, 2, dropout=dropout)
    assert_same_run(reference, resumed, atol=0.0)  # bit for bit


def test_fsdp_checkpoint_from_one_worker_resumes_on_two(
    tmp_path: Path, flights_parquet: Path, references: References
) -> None:
    """The checkpoint is resharded from 1 to 2 workers. Without dropout (whose masks depend on how the batch
    is split between ranks) the trajectory matches a 2-worker run up to float summation order."""
    reference = references["fsdp", 0.0]
    resumed = preempt_then_resume(tmp_path, flights_parquet, "fsdp", 1, 2, dropout=0.0)
    assert_same_run(reference, resumed, atol=1e-6)
