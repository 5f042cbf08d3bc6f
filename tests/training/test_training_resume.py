"""Exact resume: a run preempted by SIGTERM and resumed ends where an uninterrupted run ends; a run
resized 2 -> 4 -> 1 (an elastic job's resizes) computes what an unresized run computes."""

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
    return read_model_state(store.step_url(latest.step, latest.writer_token))


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


# Float32 sums in another order: the gradient of 32 examples summed over 1, 2 or 4 workers and 1, 2 or
# 4 micro-batches (the reference: 2 workers of 16 each) differs from the reference's in the last bits,
# and each step carries the difference on. Measured: at most 6e-8 on a step's loss, 3e-8 on a weight
# (2026-12-06). The tolerance leaves a margin of 16; a step on other examples, or a lost optimizer
# state, moves a loss by far more (the losses of successive steps here differ by 1e-3 to 2e-2). AdamW
# normalizes the gradient's scale away: the mean over the micro-batches is checked on the gradients
# themselves (test_training_batching.py).
RESIZE_TOLERANCE = 1e-6


def test_a_run_resized_2_4_1_computes_what_an_unresized_run_computes(
    tmp_path: Path, flights_parquet: Path, references: References
) -> None:
    """An elastic job's resize is a checkpoint, a stop and a restart on the new size, resuming from that
    checkpoint resharded by DCP (as the 1 -> 2 resume above). The global batch stays 32 at every size
    (micro-batches of at most 8: 2 workers accumulate 2 each, 4 workers 1, 1 worker 4) and the data
    of a step is the step's, so with dropout 0 each step's loss and the final weights are the
    unresized FSDP run's within RESIZE_TOLERANCE.

    Each gang is a new attempt (a higher fencing token, so its checkpoints are its own) handed the
    checkpoint to resume from as the control plane hands a retry its job's newest
    (GPUYARD_RESUME_URL): steps 1-4 on 2 workers, 5-8 on 4 (resumed from 2's step 4), 9-10 on 1
    (resumed from 4's step 8). A gang trains on past the step the next one resumes from (stopping it
    there would wait on a signal); what the next computes depends only on that checkpoint, and each
    step's loss kept is the last written, the one of the gang that resumed before it."""
    reference = references["fsdp", 0.0]
    cfg, work = write_config(
        tmp_path,
        flights_parquet,
        "resized",
        parallel={"strategy": "fsdp"},
        model={"dropout": 0.0},
        train={"micro_batch_size": 8},
        checkpoint={"keep_last": 10},
    )
    root = (work / "checkpoints").as_uri()
    # (workers, fencing token, step resumed from, checkpoint every: only the steps the next resumes from)
    phases = [(2, 1, None, 4), (4, 2, 4, 8), (1, 3, 8, None)]
    for workers, token, resumed, every in phases:
        env = {"GPUYARD_FENCING_TOKEN": str(token)}
        if resumed is not None:
            env["GPUYARD_RESUME_URL"] = f"{root}/step-{resumed:09d}-t{token - 1}"
        last = token == len(phases)  # only the last gang saves its final step
        overrides = [f"checkpoint.save_final={last}", f"checkpoint.interval_steps={every or 'null'}"]
        assert run_workers(cfg, workers, work, env=env, overrides=overrides) == [exit_codes.SUCCESS] * workers
    events = read_events(work)
    starts = [(e["world_size"], e["local_batch"], e["accum_steps"]) for e in events if e["event"] == "start"]
    assert starts == [(2, 8, 2), (4, 8, 1), (1, 8, 4)]
    resumes = [(e["step"], e["saved_world_size"], e["world_size"]) for e in events if e["event"] == "resume"]
    assert resumes == [(4, 2, 4), (8, 4, 1)]
    assert_same_run(reference, work, atol=RESIZE_TOLERANCE)
