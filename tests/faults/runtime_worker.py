"""The real training runtime (`python -m training.run`) on a tiny model, journaling what it does for
the invariant checker as the suite's light worker (`worker.py`) does.

    runtime_worker.py --config RUNTIME.yaml [--set key=value ...]

Nothing of the runtime is replaced: its resume rule, DCP checkpoints (fenced folders, manifest last),
heartbeat client and agent, SIGTERM handling and exit codes all run as in a job. The journal is fed by
wrapping, not changing, five of its calls:

- `Checkpointer.find_latest` -> `resume` (the step it chose; `recorded_incomplete` when the store's
  recorded checkpoint was not intact and the runtime fell back to another);
- `CheckpointStore.finalize` -> `committing` as it begins (the checkpoint may be complete from then
  on), `saved` once the manifest is durable (rank 0 writes it);
- `HeartbeatClient.beat` -> `beat` (an answer), `stale` (401/409: the runtime stops), `beat_failed`;
- `EventLog.write("step")` -> `step`; the entry point's return -> `exit` with its code;
- `os.fsync` -> the suite's hold (`$FAULTS_DIR/hold/<attempt>`: the data written, no manifest yet,
  `half_written`, waits until the file is gone or it is killed; on an object store, which is never
  fsynced, the same hold as the manifest's commit begins) and slow disk (`$FAULTS_DIR/slow-fsync`
  holds the seconds each fsync takes longer).

The working directory (rank 0's event log) is per attempt under `$FAULTS_DIR/runtime/`. In a pod (one
process per node, `training/ranks.py`), each of the node's ranks is this wrapper.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

sys.path.insert(0, str(Path(__file__).parent))
import worker as light

from training import ranks

# A pod is one process per node: this one only starts the node's ranks (each this wrapper, with its
# RANK), which journal; it journals nothing itself (rank 0 would seem to start twice) and never
# imports torch.
if (node := ranks.node_ranks(os.environ)) is not None and __name__ == "__main__":
    sys.exit(ranks.run_node(node, sys.argv[1:], entry=(__file__,)))

BEGAN = time.monotonic()
light.journal("start", runtime=True)

from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from training import checkpoint as ckpt_module  # noqa: E402  (after the start record: torch is slow)
from training import heartbeat as heartbeat_module  # noqa: E402
from training import run as run_module  # noqa: E402
from training import trainer as trainer_module  # noqa: E402
from training.heartbeat import Action  # noqa: E402

ATTEMPT = light.ATTEMPT
_saving: list[int] = []  # the step rank 0 is finalizing, while it is
_real_fsync = os.fsync


def _hold_half_written(step: int) -> None:
    """While the suite's hold file for this attempt exists, stay half way through saving `step`."""
    hold = Path(light.env["FAULTS_DIR"]) / "hold" / ATTEMPT
    if hold.exists():
        light.journal("half_written", step=step)
        while hold.exists():  # the suite kills us here
            light.pause(0.02)


def _fsync(descriptor: FileDescriptorLike) -> None:
    if _saving:
        _hold_half_written(_saving[0])
    light.slow_disk()
    _real_fsync(descriptor)


os.fsync = _fsync  # type: ignore[assignment]  (the same signature; mypy refuses to rebind a module function)

_find_latest = ckpt_module.Checkpointer.find_latest
_finalize = ckpt_module.CheckpointStore.finalize
_beat = heartbeat_module.HeartbeatClient.beat
_write = trainer_module.EventLog.write


def find_latest(self: Any, verify_checksums: bool = True, recorded: str | None = None) -> Any:
    manifest = _find_latest(self, verify_checksums, recorded)
    if recorded and self.rank == 0 and self.store.recorded(recorded, verify_checksums) is None:
        light.journal("recorded_incomplete", url=recorded)
    step = manifest.step if manifest is not None else 0
    light.journal("resume", step=step, url=recorded, began=BEGAN)
    return manifest


def finalize(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
    light.journal("committing", step=step)
    if not isinstance(self.fs, LocalFileSystem):
        # An object store is never fsynced: the save is held here, every shard uploaded and the
        # manifest that commits them not yet written (on the cluster, whose stores are S3).
        _hold_half_written(step)
    _saving.append(step)
    try:
        manifest = _finalize(self, step, *args, **kwargs)
    finally:
        _saving.clear()
    light.journal("saved", step=step, url=self.step_url(step))
    return manifest


def beat(self: Any, step: int, checkpoint: Any, *more: Any, **named: Any) -> Any:
    # Whatever else a beat carries (metrics, overheads, throughput, ...) passes through untouched: a
    # wrapper that named them broke every beat once the runtime added one (TypeError, exit 1).
    answer = _beat(self, step, checkpoint, *more, **named)
    if answer is None:
        light.journal("beat_failed", step=step, error="unreachable after retries")
    elif answer.action == Action.STOP:
        light.journal("stale", step=step)
    else:
        light.journal("beat", step=step, checkpoint=checkpoint.step if checkpoint else None)
    return answer


def write(self: Any, event: str, **fields: Any) -> None:
    _write(self, event, **fields)
    if event == "step":
        light.journal("step", step=fields["step"])


ckpt_module.Checkpointer.find_latest = find_latest  # type: ignore[method-assign]
ckpt_module.CheckpointStore.finalize = finalize  # type: ignore[method-assign]
heartbeat_module.HeartbeatClient.beat = beat  # type: ignore[method-assign]
trainer_module.EventLog.write = write  # type: ignore[method-assign]


def main() -> None:
    workdir = Path(light.env["FAULTS_DIR"]) / "runtime" / f"{ATTEMPT}-rank{light.RANK}"
    code = run_module.main([*sys.argv[1:], "--set", f"workdir={workdir}"])
    light.leave(code)


if __name__ == "__main__":
    main()
