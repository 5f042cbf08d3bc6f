"""When to checkpoint and when to stop: SIGTERM, heartbeat answers and the checkpoint schedule, agreed by
every rank at each step boundary so that all ranks stop (or checkpoint) at the same step."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from training.config import CheckpointConfig
from training.heartbeat import Action, HeartbeatAgent


class Preemption:
    """Turns SIGTERM into a flag read between steps: the current step always finishes. Installed once,
    for the process's whole life (`training.run.main`)."""

    def __init__(self) -> None:
        self.requested = threading.Event()

    def install(self) -> Preemption:
        signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested.set()


@dataclass
class CheckpointSchedule:
    """Every `interval_steps` steps and/or every `interval_s` seconds; under `interval_s: auto` the control
    plane's interval (Young/Daly) wins over `auto_fallback_s` as soon as a heartbeat brings one."""

    cfg: CheckpointConfig
    agent: HeartbeatAgent | None = None
    clock: Callable[[], float] = time.monotonic
    last_time: float = 0.0

    def __post_init__(self) -> None:
        self.last_time = self.clock()

    def interval_s(self) -> float | None:
        if self.cfg.interval_s == "auto":
            from_plane = self.agent.checkpoint_interval_s if self.agent is not None else None
            return from_plane if from_plane is not None else self.cfg.auto_fallback_s
        return self.cfg.interval_s

    def due(self, step: int) -> bool:
        if self.cfg.interval_steps is not None and step % self.cfg.interval_steps == 0:
            return True
        interval = self.interval_s()
        return interval is not None and self.clock() - self.last_time >= interval

    def saved(self) -> None:
        self.last_time = self.clock()


@dataclass(frozen=True)
class Decision:
    """The outcome of one step's exchange between ranks."""

    loss: float
    action: Action
    checkpoint_due: bool


def local_action(preemption: Preemption, agent: HeartbeatAgent | None) -> Action:
    action = Action.CHECKPOINT_AND_STOP if preemption.requested.is_set() else Action.CONTINUE
    if agent is not None:
        action = max(action, agent.action)
    return action


def votes(action: Action) -> list[float]:
    """This rank's [checkpoint-and-stop, stop] votes for the all-reduce."""
    return [float(action == Action.CHECKPOINT_AND_STOP), float(action == Action.STOP)]


def decide(sums: list[float]) -> Decision:
    """`sums` is the all-reduced [loss * rows, rows, checkpoint-and-stop votes, stop votes, checkpoint due]
    of every rank: any stop vote stops everyone; any preemption vote checkpoints and stops everyone."""
    loss_sum, rows, ckpt_stop, stop, due = sums
    action = Action.STOP if stop > 0 else Action.CHECKPOINT_AND_STOP if ckpt_stop > 0 else Action.CONTINUE
    return Decision(loss_sum / max(rows, 1.0), action, due > 0)
