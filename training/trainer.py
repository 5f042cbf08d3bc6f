"""One rank of a training run (`training/run.py` starts it): trains the configured model kind
(training/workloads.py: the MLP on the parquet training set with DDP or FSDP, the transformer in any
parallel layout), resumes from the newest complete checkpoint, checkpoints on schedule, obeys SIGTERM
and heartbeat answers, and records one MLflow run per training run. Exit codes: see
training/exit_codes.py.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from training import distributed, exit_codes, workloads
from training.adaptive import AdaptiveBatch
from training.checkpoint import Checkpointer, CheckpointStore
from training.config import Config, load
from training.control import CheckpointSchedule, Preemption, decide, local_action, votes
from training.efficiency import GradStats, estimate
from training.heartbeat import Action, HeartbeatAgent, HeartbeatClient, LauncherEnv, Overheads, Throughput
from training.mlflow_tracking import Tracker, make_tracker

log = logging.getLogger("training")

MEASURED_STEPS = 20  # the step time a heartbeat reports: the median of the newest this many


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = value
    return out


def lr_lambda(cfg: Config, scale: Callable[[], float] = lambda: 1.0) -> Any:
    """Linear warm-up, then cosine decay to 10% of the peak rate; times `scale()` (an adaptive
    batch's learning-rate scale, training/adaptive.py)."""
    warmup, total = cfg.train.warmup_steps, cfg.train.max_steps

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup * scale()
        progress = (step - warmup) / max(1, total - warmup)
        return (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))) * scale()

    return factor


def step_stats(
    pieces: workloads.Pieces | None, piece_batch: int, start: int, world: distributed.World, step_s: float
) -> tuple[GradStats | None, float, float]:
    """One step's gradient statistics (None: fewer than two micro-batches over the gang) and its
    seconds and forward-and-backward seconds, averaged over the ranks: the same on every rank."""
    if pieces is None:
        raise RuntimeError("train.adaptive_batch: the workload measured no micro-batch gradients")
    sqr_sum, count, step_sum, compute_sum = distributed.all_sum(
        [pieces.sqr_sum, pieces.count, step_s, pieces.compute_s], world.device
    )
    n = round(count)
    stats = None
    if n >= 2:
        stats = estimate(sqr_sum / n, pieces.mean_sqr, n, piece_batch, start)
    return stats, step_sum / world.world_size, compute_sum / world.world_size


class EventLog:
    """Rank 0's JSON-lines record of the run (steps, checkpoints, exits) in the working directory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields: Any) -> None:
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def train(cfg: Config, world: distributed.World, env: LauncherEnv, preemption: Preemption) -> int:
    leader = world.is_leader
    events = EventLog(Path(cfg.workdir, "events.jsonl") if leader else None)
    workload = workloads.build(cfg, world)  # seeds the initial weights alike on every rank
    model, strategy, why, n_params = workload.model, workload.strategy, workload.reason, workload.n_parameters
    split = workload.split
    bounds = cfg.train.adaptive_batch
    adaptive = None
    if bounds is not None:
        start = cfg.train.global_batch_size
        adaptive = AdaptiveBatch(bounds, start, split.replicas, cfg.train.micro_batch_size)
    if leader:
        log.info("model %s, %d parameters, strategy %s: %s", cfg.model.kind, n_params, strategy, why)
        log.info(
            "global batch %d over %d data-parallel workers: %d micro-batch(es) of %d each per step",
            split.global_batch,
            split.replicas,
            split.accum_steps,
            split.local_batch,
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)

    def lr_scale() -> float:
        return adaptive.lr_scale if adaptive is not None else 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, lr_scale))

    # Fenced like the leases: this attempt writes only folders named with its own token (checkpoint.py).
    token = int(env.fencing_token) if env.fencing_token else None
    store = CheckpointStore(cfg.checkpoint_url(), token, cfg.checkpoint.io_timeout_s)
    ckpt = Checkpointer(
        store,
        world.rank,
        world.world_size,
        world.checkpoint_group,
        async_save=cfg.checkpoint.async_save,
        keep_last=cfg.checkpoint.keep_last,
        best_metric=cfg.checkpoint.keep_best_metric,
        best_mode=cfg.checkpoint.best_mode,
    )
    step, run_id, samples_seen = 0, None, 0
    restore_began = time.perf_counter()
    restored_step: int | None = None
    manifest = ckpt.find_latest(cfg.checkpoint.verify_checksums, recorded=env.resume_url)
    if manifest is not None:
        restored = ckpt.restore(manifest, model, optimizer)
        scheduler.load_state_dict(restored.trainer["scheduler"])
        step = int(restored.trainer["step"])
        samples_seen = int(restored.trainer.get("samples_seen", step * cfg.train.global_batch_size))
        if adaptive is not None:
            if "adaptive" in restored.trainer:
                adaptive.load_state_dict(restored.trainer["adaptive"])
            workload.rebatch(adaptive.global_batch, step, samples_seen)
        restored_step = step
        run_id = manifest.run.get("mlflow_run_id")
        if not restored.rng_restored:
            torch.manual_seed(cfg.seed + 7919 * (world.rank + 1) + step)
        events.write("resume", step=step, world_size=world.world_size, saved_world_size=manifest.world_size)
        log.info(
            "resumed from %s (saved by %d ranks)",
            store.step_url(step, manifest.writer_token),
            manifest.world_size,
        )
    else:
        torch.manual_seed(cfg.seed + 7919 * (world.rank + 1))  # per-rank stream (dropout)
    restore_s = time.perf_counter() - restore_began

    tracker: Tracker = make_tracker(cfg.mlflow, cfg.workdir, world.rank, env.job_id, env.attempt_id)
    run_id = tracker.start(run_id, step) or run_id
    run_ids = {"mlflow_run_id": run_id, "job_id": env.job_id, "attempt_id": env.attempt_id}
    tracker.log_params({**_flatten("", asdict(cfg), {}), "n_parameters": n_params, "strategy": strategy})
    tracker.set_tags({"gpuyard.strategy": strategy, "gpuyard.strategy_reason": why})
    tracker.log_metrics({"world_size": world.world_size}, step)

    progress: dict[str, Any] = {"step": step, "metrics": {}, "throughput": None}
    agent = None
    if leader and env.managed:
        client = HeartbeatClient(
            env.api_url or "",
            env.attempt_id or "",
            env.fencing_token or "",
            env.attempt_secret or "",
            timeout_s=cfg.heartbeat.timeout_s,
        )
        agent = HeartbeatAgent(
            client,
            cfg.heartbeat.interval_s,
            lambda: (progress["step"], ckpt.latest, progress["metrics"]),
            recorded=ckpt.recorded_by_control_plane,
            overheads=lambda: Overheads(restored_step, restore_s, sum(ckpt.stalls_s)),
            throughput=lambda: progress["throughput"],
        ).start()
    schedule = CheckpointSchedule(cfg.checkpoint, agent)
    events.write(
        "start",
        step=step,
        world_size=world.world_size,
        model=cfg.model.kind,
        strategy=strategy,
        strategy_reason=why,
        n_parameters=n_params,
        global_batch=workload.split.global_batch,
        local_batch=workload.split.local_batch,
        accum_steps=workload.split.accum_steps,
    )

    def save(current: int, train_loss: float | None, *, force_sync: bool = False) -> None:
        metrics = workload.evaluate()
        if train_loss is not None:
            metrics["train_loss_window"] = train_loss
        state: dict[str, Any] = {"scheduler": scheduler.state_dict(), "samples_seen": samples_seen}
        if adaptive is not None:
            state["adaptive"] = adaptive.state_dict()
        ckpt.save(
            current,
            model,
            optimizer,
            state,
            metrics,
            run_ids,
            force_sync=force_sync,
        )
        schedule.saved()
        tracker.log_metrics({**metrics, "checkpoint_stall_s": ckpt.stalls_s[-1]}, current)
        events.write("checkpoint", step=current, stall_s=ckpt.stalls_s[-1], metrics=metrics)

    model.train()
    window: list[float] = []
    step_times: deque[float] = deque(maxlen=MEASURED_STEPS)
    t_last = time.perf_counter()
    code = exit_codes.SUCCESS
    try:
        while step < cfg.train.max_steps:
            began = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss_rows, rows = workload.forward_backward(step)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            step_times.append(time.perf_counter() - began)
            trained = workload.split
            samples_seen += trained.global_batch
            # Replaced whole, never changed in place: the heartbeat thread reads it.
            progress["throughput"] = Throughput(
                statistics.median(step_times), trained.local_batch, trained.accum_steps, trained.global_batch
            )
            if adaptive is not None:
                stats, step_s, compute_s = step_stats(
                    workload.pieces, trained.local_batch, adaptive.start, world, step_times[-1]
                )
                adaptive.observe(stats, step_s, compute_s, trained.share)
                if adaptive.due(step + 1) and adaptive.choose():
                    workload.rebatch(adaptive.global_batch, step + 1, samples_seen)
                    step_times.clear()  # the throughput reported is the new batch's
                    chosen = workload.split
                    noise = adaptive.noise.stats()
                    events.write(
                        "batch",
                        after_step=step + 1,
                        global_batch=chosen.global_batch,
                        local_batch=chosen.local_batch,
                        accum_steps=chosen.accum_steps,
                        lr_scale=adaptive.lr_scale,
                        grad_sqr=noise.sqr if noise else None,
                        grad_var=noise.var if noise else None,
                    )
                    if leader:
                        log.info("adaptive batch: %d after step %d", chosen.global_batch, step + 1)
            scheduler.step()  # the next step's rate: at the batch just chosen
            if cfg.train.step_sleep_s:
                time.sleep(cfg.train.step_sleep_s)
            step += 1
            due = leader and schedule.due(step)
            if due and agent is not None and agent.lease_lapsed:
                # Our lease may have passed and a successor own the job: no periodic checkpoint until a
                # beat is answered again. (A preemption's last save still goes to our own fenced folder.)
                log.warning("step %d: no heartbeat answered within the lease: checkpoint skipped", step)
                due = False
            action = local_action(preemption, agent)
            decision = decide(
                distributed.all_sum([loss_rows, rows, *votes(action), float(due)], world.device)
            )
            window.append(decision.loss)
            progress["step"] = step
            progress["metrics"] = {"train_loss": decision.loss}
            if step % cfg.train.log_every == 0 or step == cfg.train.max_steps:
                now = time.perf_counter()
                rate = cfg.train.log_every / max(now - t_last, 1e-9)
                tracker.log_metrics(
                    {"train_loss": decision.loss, "lr": scheduler.get_last_lr()[0], "steps_per_s": rate}, step
                )
                if world.rank == 0:  # progress in the worker's log (`gpuyard logs`), not only in MLflow
                    log.info(
                        "step %d/%d loss %.4f (%.1f steps/s)", step, cfg.train.max_steps, decision.loss, rate
                    )
                t_last = now
            events.write("step", step=step, loss=decision.loss, global_batch=trained.global_batch, lr=lr)
            if decision.action == Action.STOP:
                log.error(
                    "attempt refused (ended, or a stale token) at step %d: exiting without writing", step
                )
                code = exit_codes.STALE_FENCING_TOKEN
                ckpt.abandon()
                break
            if decision.action == Action.CHECKPOINT_AND_STOP:
                log.warning("preempted at step %d: checkpointing and exiting", step)
                save(step, sum(window) / len(window), force_sync=True)
                code = exit_codes.PREEMPTED
                break
            if decision.checkpoint_due and step < cfg.train.max_steps:
                save(step, sum(window) / len(window))
                window = []
        else:
            resumed_at_end = ckpt.latest is not None and ckpt.latest.step == step
            if cfg.checkpoint.save_final and not resumed_at_end:
                save(step, sum(window) / len(window) if window else None, force_sync=True)
            # The same on every rank: the export gathers the full model (a collective).
            if cfg.mlflow.enabled and cfg.mlflow.log_model:
                workload.export(tracker)
        ckpt.close()
    except BaseException:
        tracker.end("FAILED")
        if agent is not None:
            agent.stop(final_beat=False)
        raise
    if agent is not None:
        agent.stop(final_beat=code != exit_codes.STALE_FENCING_TOKEN)
    tracker.end({exit_codes.SUCCESS: "FINISHED", exit_codes.PREEMPTED: "KILLED"}.get(code, "FAILED"))
    events.write("exit", step=step, code=code, reason=exit_codes.DESCRIPTIONS.get(code, "failure"))
    return code


def run_rank(config: str, overrides: Sequence[str]) -> int:
    """Train as the rank the environment names (RANK, WORLD_SIZE, ...; a group of one without them)."""
    # SIGTERM is a request read between steps for the process's whole life: one that comes while it
    # starts stops the run at its first step (checkpoint, exit 75), one that comes once the outcome is
    # decided (the final beat, the teardown) changes nothing. Left to its default action, it turned a
    # finished run or a preemption into "killed by signal 15" (the fault campaign's seed 500).
    preemption = Preemption().install()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s"
    )
    try:
        cfg = load(config, list(overrides))
        workloads.check(cfg)
        env = LauncherEnv.read()
        env.check()
    except (OSError, ValueError) as exc:
        log.error("%s", exc)
        return exit_codes.FAILURE
    world = distributed.init(cfg.parallel.backend)
    try:
        return train(cfg, world, env, preemption)
    except Exception:
        log.exception("training failed")
        return exit_codes.FAILURE
    finally:
        distributed.shutdown()
        # The interpreter's last collections walk every object torch's modules made: 0.5 s of each
        # exit on this machine, and an interrupted job's relaunch waits for the exit. Frozen objects
        # are left to the process's end (atexit handlers and buffered output still run).
        gc.freeze()
