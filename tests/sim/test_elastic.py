"""The Pollux study's elastic job model (sim/elastic) on its measured applications: times exact on the
measured rows and linear between them, statistical efficiency 1 at the initial batch, ncf pinned and
yolov3's local batch capped, a restart on every (re)allocation, Tiresias' demotion at 16 GPU-hours,
and a few jobs of a workload replayed end to end."""

from __future__ import annotations

import csv
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from gpuyard.domain.elastic import Measured, Sizing, fair_goodput, growth_limit, sizes
from gpuyard.sim.elastic.jobs import ElasticJob, Submission, read_workload
from gpuyard.sim.elastic.policies import POLICIES, TIRESIAS_THRESHOLD_GPU_S, Tiresias
from gpuyard.sim.elastic.profiles import Application, canonical, load_application, load_applications
from gpuyard.sim.elastic.replay import jcts, placement_of, replay
from gpuyard.sim.elastic.sizing import GpuyardSizing, place, prior_model
from gpuyard.sim.trace import TraceError

POLLUX = Path(__file__).resolve().parents[3] / "shared" / "traces" / "pollux"
APPLICATIONS = POLLUX / "applications"
PUBLISHED_MEAN_H = 1.026  # traces/README.md: Tiresias (tuned jobs), mean of workloads 1-4


@pytest.fixture
def apps() -> dict[str, Application]:
    assert APPLICATIONS.is_dir(), f"the Pollux traces are expected under {POLLUX}"
    return load_applications(APPLICATIONS)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def job(app: Application, replicas: int, batch: int, name: str = "j") -> ElasticJob:
    return ElasticJob(name, app, 0.0, replicas, batch)


def test_times_are_the_measured_rows_and_linear_between_them(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    measured = {
        (r["placement"], int(r["local_bsz"])): (float(r["step_time"]), float(r["sync_time"]))
        for r in rows(APPLICATIONS / "cifar10" / "placements.csv")
    }
    # A placement is keyed by its smallest rotation: 4 + 2 GPUs is the row `24`.
    assert canonical((4, 2)) == (2, 4)
    assert cifar.times((4, 2), 64) == measured["24", 64]
    assert cifar.times((2, 4), 91) == measured["24", 91]
    lo, hi = measured["24", 64], measured["24", 91]
    between = cifar.times((2, 4), 77)
    w = (77 - 64) / (91 - 64)
    assert between == pytest.approx((lo[0] + (hi[0] - lo[0]) * w, lo[1] + (hi[1] - lo[1]) * w))
    # 6 nodes are not in placements.csv: the scalability rows, exact at a measured point.
    scalability = {
        (int(r["num_nodes"]), int(r["num_replicas"]), int(r["local_bsz"])): (
            float(r["step_time"]),
            float(r["sync_time"]),
        )
        for r in rows(APPLICATIONS / "cifar10" / "scalability.csv")
    }
    assert cifar.times((2,) * 6, 129) == scalability[6, 12, 129]
    # 5 nodes: between the 4-node placements of 10 GPUs (averaged) and the 6-node row of 10 GPUs.
    four = cifar.shapes[4][10].at(129)
    six = scalability[6, 10, 129]
    assert four is not None
    five = cifar.times((2, 2, 2, 2, 2), 129)
    for i in (0, 1):
        assert min(four[i], six[i]) <= five[i] <= max(four[i], six[i])
    with pytest.raises(ValueError, match="no measurements around placement"):
        cifar.times((1,), 100_000)


def test_statistical_efficiency_is_one_at_the_initial_batch(apps: dict[str, Application]) -> None:
    for app in apps.values():
        for epoch in range(app.epochs):
            assert app.gain(app.init_batch_size, epoch) == pytest.approx(1.0)
            for curve in app.curves:
                # Exact at a measured batch; a larger batch's step is worth 1 to `scale` small steps.
                assert app.grad_stats(curve.batch_size, epoch) == (
                    curve.grad_sqr[epoch],
                    curve.grad_var[epoch],
                )
                scale = curve.batch_size / app.init_batch_size
                assert 1.0 <= app.gain(curve.batch_size, epoch) <= scale * (1 + 1e-12)
    # The study's gain from the measured gradient: cifar10 at 1024 (8 x its initial 128), first epoch.
    first = rows(APPLICATIONS / "cifar10" / "validation-1024.csv")[0]
    sqr, var = float(first["grad_sqr"]), float(first["grad_var"])
    cifar = apps["cifar10"]
    assert cifar.gain(1024, 0) == pytest.approx((var + sqr) / (var / 8 + sqr))
    assert cifar.gain(1024, 0) < 8
    lo, hi = cifar.curves[1], cifar.curves[2]
    middle = cifar.grad_stats((lo.batch_size + hi.batch_size) / 2, 3)
    assert middle == pytest.approx(
        ((lo.grad_sqr[3] + hi.grad_sqr[3]) / 2, (lo.grad_var[3] + hi.grad_var[3]) / 2)
    )
    with pytest.raises(ValueError, match="outside the measured"):
        cifar.gain(cifar.max_batch_size * 2, 0)


def test_a_job_is_done_at_the_last_row_of_the_curves(apps: dict[str, Application]) -> None:
    for name, app in apps.items():
        curves = [rows(path) for path in sorted((APPLICATIONS / name).glob("validation-*.csv"))]
        assert app.epochs == min(len(c) for c in curves)
        assert app.epoch_end(app.epochs - 1) == min(float(c[app.epochs - 1]["progress"]) for c in curves)
    ncf = job(apps["ncf"], 1, 32768)
    ncf.reallocate((1,), restart_s=0)
    ncf.advance(0, 10**6)
    assert ncf.epoch == apps["ncf"].epochs
    assert ncf.progress == apps["ncf"].epoch_end(apps["ncf"].epochs - 1)
    assert ncf.completed_s is not None and 0 < ncf.completed_s < 10**6


def test_ncf_stays_on_one_gpu_at_32768_and_yolov3_computes_at_most_8_a_gpu(
    apps: dict[str, Application],
) -> None:
    submission = Submission("ncf-0", 0.0, "ncf", num_replicas=4, batch_size=1024)
    ncf = ElasticJob.from_submission(submission, apps)
    assert (ncf.num_replicas, ncf.batch_size) == (1, 32768)
    with pytest.raises(ValueError, match="trains on 1 GPU"):
        ncf.reallocate((2,), restart_s=30)
    ncf.reallocate((1,), restart_s=30)
    # One GPU above the initial batch accumulates at least two micro-batches, as the study's jobs do.
    assert (ncf.atomic_bsz, ncf.accum_steps, ncf.trained_batch) == (16384, 1, 32768)

    yolo = apps["yolov3"]
    assert max(series.local_bsz[-1] for series in yolo.placements.values()) == 16  # measured up to 16
    assert yolo.max_local_bsz == 8
    assert yolo.batch_split(4, 64) == (8, 1)
    assert yolo.batch_split(1, 64) == (8, 7)
    assert yolo.batch_split(8, 64) == (8, 0)
    # Rounding up never takes a batch past the largest measured: 4096 over 12 GPUs is 12 x 341.
    assert apps["cifar10"].batch_split(12, 4096) == (341, 0)


def test_every_allocation_costs_the_restart_the_first_included(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    j = job(cifar, 4, 2048)
    j.reallocate((4,), restart_s=30)
    j.advance(0, 30)
    assert j.progress == 0 and j.allocations == 1
    j.advance(30, 30)
    step_s, sync_s = cifar.times((4,), j.atomic_bsz)
    rate = cifar.gain(j.trained_batch, 0) / (step_s + (step_s - sync_s) * j.accum_steps)
    assert j.progress == pytest.approx(30 * rate)
    # Preempted: no progress while it holds nothing; back on another placement: 30 s more.
    j.reallocate((), restart_s=30)
    j.advance(60, 60)
    assert j.progress == pytest.approx(30 * rate)
    j.reallocate((2, 2), restart_s=30)
    j.advance(120, 60)
    rate_22 = cifar.gain(j.trained_batch, 0) / cifar.times((2, 2), j.atomic_bsz)[0]
    assert j.allocations == 2
    assert j.progress == pytest.approx(30 * rate + 30 * rate_22)
    # A restart longer than the interval carries over.
    j.reallocate((4,), restart_s=90)
    before = j.progress
    j.advance(180, 60)
    assert j.progress == before and j.restart_left_s == 30


def test_tiresias_demotes_a_job_past_16_gpu_hours(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    first, second = job(cifar, 4, 2048, "first"), job(cifar, 4, 2048, "second")
    policy = POLICIES["tiresias"]()
    assert isinstance(policy, Tiresias)
    one_node = [4]
    held = policy.allocate(0, [first], one_node, {})
    assert held == {"first": (0, 0, 0, 0)}
    # The older job keeps the node and the other waits behind it in the first queue...
    at_threshold = TIRESIAS_THRESHOLD_GPU_S // 4  # seconds on its 4 GPUs
    for now_s in (60, at_threshold - 60):
        held = policy.allocate(now_s, [first, second], one_node, held)
        assert held == {"first": (0, 0, 0, 0)}
        assert policy.queues == (["first", "second"], [])
    # ...until the GPU-time it ran reaches 16 GPU-hours: demoted behind the other, it is preempted.
    held = policy.allocate(at_threshold, [first, second], one_node, held)
    assert policy.queues == (["second"], ["first"])
    assert held == {"second": (0, 0, 0, 0)}


def test_tiresias_takes_the_nodes_with_the_most_free_gpus_first(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    small, big, later = job(cifar, 1, 128, "small"), job(cifar, 6, 2048, "big"), job(cifar, 8, 2048, "later")
    policy = Tiresias()
    held = policy.allocate(60, [small, big], [4, 4, 4], {})
    assert held == {"small": (0,), "big": (1, 1, 1, 1, 2, 2)}
    assert placement_of(held["big"]) == (4, 2)
    # 8 GPUs no longer fit (5 are free), but a smaller job behind them does: on the freest node.
    tiny = job(cifar, 1, 128, "tiny")
    held = policy.allocate(120, [small, big, later, tiny], [4, 4, 4], held)
    assert "later" not in held
    assert held["tiny"] == (0,)


def test_a_few_jobs_of_a_workload_replay_end_to_end(apps: dict[str, Application]) -> None:
    submissions = read_workload(POLLUX / "workloads" / "workload-1.csv", apps)[:6]
    assert sum(s.num_replicas for s in submissions) <= 64  # none waits for another on the cluster

    jobs = replay(submissions, apps, "tiresias")
    assert [j.name for j in jobs] == [s.name for s in submissions]
    assert all(j.completed_s is not None and j.allocations == 1 for j in jobs)
    for j in jobs:
        # Wait for the next interval, restart 30 s, then train epoch by epoch at its own rate.
        start = math.ceil(j.submitted_s / 60) * 60 + 30
        train = 0.0
        done = 0.0
        for epoch in range(j.app.epochs):
            end = j.app.epoch_end(epoch)
            step_s, sync_s = j.app.times(j.placement, j.atomic_bsz)
            train += (end - done) / (
                j.app.gain(j.trained_batch, epoch) / (step_s + (step_s - sync_s) * j.accum_steps)
            )
            done = end
        assert jcts([j])[j.name] == pytest.approx(start - j.submitted_s + train, abs=0.5 * j.app.epochs + 1)

    # On 2 nodes they contend: never more GPUs held than there are, each job all its GPUs or none.
    def check(now_s: int, active: Sequence[ElasticJob]) -> None:
        assert sum(sum(j.placement) for j in active) <= 8
        assert all(sum(j.placement) in (0, j.num_replicas) for j in active)

    crowded = replay(
        [s for s in submissions if s.num_replicas <= 8], apps, "tiresias", nodes=2, on_interval=check
    )
    assert all(j.completed_s is not None for j in crowded)


def test_tiresias_on_the_four_workloads_is_within_15_percent_of_the_published_mean(
    apps: dict[str, Application],
) -> None:
    averages = []
    for i in range(1, 5):
        by_job = jcts(replay(read_workload(POLLUX / "workloads" / f"workload-{i}.csv", apps), apps))
        assert len(by_job) == 160
        averages.append(sum(by_job.values()) / len(by_job) / 3600)
    assert sum(averages) / 4 == pytest.approx(PUBLISHED_MEAN_H, rel=0.15)


def test_bad_input_is_refused_naming_file_and_line(tmp_path: Path, apps: dict[str, Application]) -> None:
    folder = tmp_path / "cifar10"
    shutil.copytree(APPLICATIONS / "cifar10", folder)
    placements = folder / "placements.csv"
    lines = placements.read_text().splitlines()
    lines[2] = "1,many,0.05,0.0005"
    placements.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"placements\.csv: row 3, column 'local_bsz'"):
        load_application(folder)

    shutil.copy(APPLICATIONS / "cifar10" / "placements.csv", placements)
    curve = folder / "validation-256.csv"
    lines = curve.read_text().splitlines()
    lines[3] = lines[1]  # progress goes back
    curve.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"validation-256\.csv: row 4, column 'progress'"):
        load_application(folder)

    workload = tmp_path / "workload.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,4,2048\nb,5,gpt,4,2048\n")
    with pytest.raises(TraceError, match=r"workload\.csv: row 3, column 'application'"):
        read_workload(workload, apps)
    workload.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,4,99999\n")
    with pytest.raises(TraceError, match=r"workload\.csv: row 2, column 'batch_size'"):
        read_workload(workload, apps)


def held_job(
    app: Application, replicas: int, batch: int, name: str, placement: tuple[int, ...]
) -> ElasticJob:
    j = job(app, replicas, batch, name)
    j.reallocate(placement, restart_s=0)
    return j


def test_gpuyard_shrinks_a_job_before_preempting_any(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    big = held_job(cifar, 4, 2048, "big", (4,))
    policy = GpuyardSizing(adaptive_batch=False)
    assert policy.allocate(600, [big], [4], {"big": (0, 0, 0, 0)}) == {"big": (0, 0, 0, 0)}
    # A new job on the full node: the big one gives back GPUs, neither waits.
    new = job(cifar, 4, 2048, "new")
    new.submitted_s = 600
    held = policy.allocate(660, [big, new], [4], {"big": (0, 0, 0, 0)})
    assert len(held["big"]) >= 1 and len(held["new"]) >= 1
    assert len(held["big"]) + len(held["new"]) <= 4
    # Jobs outnumber GPUs: the least served run, and a waiting one takes its turn in time.
    third = job(cifar, 4, 2048, "third")
    ran: set[str] = set()
    held = {}
    for now_s in range(720, 3 * 3600, 60):  # big ran 2400 GPU-seconds before: it waits its turn
        before, held = held, policy.allocate(now_s, [big, new, third], [2], held)
        for j in (big, new, third):
            if held.get(j.name) != before.get(j.name):
                j.reallocate(placement_of(held.get(j.name, ())), restart_s=30)
        assert sum(len(a) for a in held.values()) <= 2
        ran |= set(held)
    assert ran == {"big", "new", "third"}


def test_gpuyard_grows_into_idle_gpus_and_not_for_less_than_a_restart(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    # On 1 GPU at a global batch of 2048 (accumulated), 3 idle GPUs on its node: it takes them.
    alone = held_job(cifar, 4, 2048, "alone", (1,))
    policy = GpuyardSizing(adaptive_batch=False)
    policy.allocate(600, [alone], [4], {"alone": (0,)})
    held = policy.allocate(1200, [alone], [4], {"alone": (0,)})
    assert held == {"alone": (0, 0, 0, 0)}
    # The rule itself: a held size is left only for a speedup that beats the restart's share.
    small_gain = {1: 1.0, 2: 1.05, 3: 1.08}
    assert sizes([Sizing("j", small_gain, 2, 0.9, 1)], 4) == {"j": 2}
    big_gain = {1: 1.0, 2: 1.05, 3: 1.5}
    assert sizes([Sizing("j", big_gain, 2, 0.9, 1)], 4) == {"j": 3}
    # A job that starts anyway (holds nothing) pays no extra for its size.
    assert sizes([Sizing("j", small_gain, 0, 0.9, 1)], 4) == {"j": 3}


def test_gpuyard_counts_each_speedup_from_the_job_s_fair_share() -> None:
    # 6 GPUs for 3 jobs: a share of 2 each. Over its first GPU, a job that makes 10% more of its
    # second would take it; over its share, the GPUs go to the one that scales.
    flat = {1: 1.0, 2: 1.08, 3: 1.16, 4: 1.24}
    linear = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    flatter = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}
    jobs = [Sizing("a", flat, 0, 1.0, 1), Sizing("b", linear, 0, 1.0, 1), Sizing("c", flatter, 0, 1.0, 1)]
    assert sizes(jobs, 6) == {"a": 1, "b": 4, "c": 1}
    # Its share taken as the largest of its sizes within it, its smallest where none is.
    assert fair_goodput({1: 1.0, 2: 1.8, 4: 3.0}, 3) == 1.8
    assert fair_goodput({2: 1.8, 4: 3.0}, 1) == 1.8


def test_a_job_that_fits_a_node_takes_one_and_smaller_jobs_move_to_make_room() -> None:
    # Node 0 has 3 free, node 1 has 2: a job of 4 moves the 1-GPU job out rather than spread.
    keep = {"one": (0,), "two": (1, 1)}
    assert place({"four": 4}, keep, [4, 4]) == {"four": (0, 0, 0, 0), "one": (1,), "two": (1, 1)}
    # Only smaller jobs move: with none to move, the job spreads and the others stay.
    keep = {"x": (0, 0, 0), "y": (1, 1, 1)}
    assert place({"pair": 2}, keep, [4, 4]) == {"x": (0, 0, 0), "y": (1, 1, 1), "pair": (0, 1)}


def test_a_job_s_agent_re_picks_its_batch_at_each_epoch_s_end_without_a_restart(
    apps: dict[str, Application],
) -> None:
    cifar = apps["cifar10"]
    j = held_job(cifar, 4, 512, "j", (4,))
    picked: list[int] = []

    def agent(job: ElasticJob) -> int:
        picked.append(job.epoch)
        return 1024

    j.agent = agent
    j.advance(0, 3600)  # many of cifar10's short epochs
    assert picked[:2] == [1, 2] and j.batch_size == 1024 and j.trained_batch == 1024
    assert j.allocations == 1 and j.restart_left_s == 0
    # The policy gives its jobs' agents to adaptive batch only.
    for adaptive in (True, False):
        k = held_job(cifar, 4, 512, "k", (4,))
        GpuyardSizing(adaptive_batch=adaptive).allocate(600, [k], [4], {"k": (0, 0, 0, 0)})
        assert (k.agent is not None) == adaptive


def test_gpuyard_fixed_batch_keeps_the_global_batch_and_adaptive_stays_within_the_curves(
    apps: dict[str, Application],
) -> None:
    submissions = [
        s for s in read_workload(POLLUX / "workloads" / "workload-1.csv", apps)[:14] if s.num_replicas <= 16
    ]
    tuned = {s.name: s.batch_size for s in submissions}

    def fixed(now_s: int, active: Sequence[ElasticJob]) -> None:
        for j in active:
            assert j.batch_size == (32768 if j.app.name == "ncf" else tuned[j.name])
            if j.placement:
                assert abs(j.trained_batch - j.batch_size) < sum(j.placement) * (j.accum_steps + 1)

    jobs = replay(submissions, apps, "gpuyard-fixed-batch", nodes=4, on_interval=fixed)
    assert all(j.completed_s is not None for j in jobs)
    sizes: set[int] = set()

    def adaptive(now_s: int, active: Sequence[ElasticJob]) -> None:
        for j in active:
            assert j.app.init_batch_size <= j.batch_size <= j.app.max_batch_size
            sizes.add(j.batch_size)

    assert all(
        j.completed_s is not None for j in replay(submissions, apps, "gpuyard", nodes=4, on_interval=adaptive)
    )
    assert len(sizes - set(tuned.values())) > 0  # it did adapt


def test_gpuyard_fits_only_what_a_job_ran(
    apps: dict[str, Application], monkeypatch: pytest.MonkeyPatch
) -> None:
    cifar = apps["cifar10"]
    model = prior_model(cifar, 256)
    assert model.runs == {} and model.most_gpus_run == 0
    step_s, sync_s = cifar.times((2,), 512)
    model.observe(1, 2, 512, Measured(step_s, 1, step_s - sync_s))
    # Exact where it ran; across nodes (never run) the prior: a whole 1-GPU step at the tuned batch.
    assert model.step_s(1, 2, 512, 1) == pytest.approx(step_s)
    assert model.sync_s(2, 8) == pytest.approx(max(model.reference_compute, sync_s))
    assert model.most_gpus_run == 2 and growth_limit(model, 1) == 8  # at most four times what it ran
    # In a replay, the policy reads a job's step times only on the placement it holds.
    seen: list[tuple[int, ...]] = []
    holding: set[tuple[int, ...]] = set()
    times = Application.times

    def spy(self: Application, placement: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        seen.append(tuple(placement))
        return times(self, placement, local_bsz)

    policy = GpuyardSizing()
    allocate = policy.allocate

    def watched(now_s: int, jobs: Sequence[ElasticJob], node_gpus: Sequence[int], held: dict) -> dict:
        holding.clear()
        holding.update(j.placement for j in jobs if j.placement)
        seen.clear()
        monkeypatch.setattr(Application, "times", spy)
        try:
            return allocate(now_s, jobs, node_gpus, held)
        finally:
            monkeypatch.setattr(Application, "times", times)
            assert set(seen) <= holding

    policy.allocate = watched  # type: ignore[method-assign]
    submissions = read_workload(POLLUX / "workloads" / "workload-1.csv", apps)[:6]
    assert all(j.completed_s is not None for j in replay(submissions, apps, policy, nodes=4))
