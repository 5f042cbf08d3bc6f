"""time_to_resume.py's training worker: the fault suite's real-runtime worker
(tests/faults/runtime_worker.py: `python -m training.run` on the suite's tiny model, journaling its
start, resume, saves, beats, steps and exit) plus the moments of a start the benchmark splits it by:

- `imported`: torch and the runtime are imported (`start` is journaled before);
- `joined`: the process group is up (`distributed.init`: the rendezvous of the ranks);
- `restore_began`, `restored`: the worker's restore, `Checkpointer.find_latest` (the checkpoint
  chosen and its checksums verified) then `Checkpointer.restore` (model, optimizer, RNG and trainer
  state loaded); no `restored` when there was nothing to restore.

A Kubernetes pod is one process per node that starts the node's ranks itself (training/ranks.py) as
`python -m training.run`, importing no torch; here that process journals as rank -1 (its `start`,
`exit`) and starts each rank as this script instead, so every rank journals as under the local
launcher.

    resume_worker.py --config RUNTIME.yaml [--set key=value ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from training import ranks as ranks_module  # no torch: before the `start` record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "faults"))
import worker as light  # the journal (runtime_worker's own)

NODE = ranks_module.node_ranks(os.environ) is not None  # a pod's process, which starts the node's ranks


def start_rank(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """training/ranks.py's start of a rank, `python -m training.run ARGS`, as this script."""
    assert argv[1:3] == ["-m", "training.run"], argv
    return subprocess.Popen([argv[0], str(Path(__file__).resolve()), *argv[3:]], **kwargs)


def node_main() -> None:
    """The pod's process: the runtime's own entry point, which starts the ranks and imports no torch."""
    from training import run

    light.RANK = -1  # journaled as the node, not as its rank 0
    light.journal("start", runtime=True)
    ranks_module.subprocess = SimpleNamespace(Popen=start_rank)  # type: ignore[assignment]
    light.leave(run.main(sys.argv[1:]))


if NODE:
    if __name__ == "__main__":
        node_main()
else:
    import runtime_worker  # journals `start`, then imports torch and the runtime, wraps its calls

    ckpt_module, light = runtime_worker.ckpt_module, runtime_worker.light
    light.journal("imported")
    distributed = runtime_worker.trainer_module.distributed
    _init = distributed.init
    _find_latest = ckpt_module.Checkpointer.find_latest  # runtime_worker's wrapper: journals `resume`
    _restore = ckpt_module.Checkpointer.restore

    def find_latest(self: Any, *args: Any, **kwargs: Any) -> Any:
        light.journal("restore_began")
        return _find_latest(self, *args, **kwargs)

    def restore(self: Any, *args: Any, **kwargs: Any) -> Any:
        restored = _restore(self, *args, **kwargs)
        light.journal("restored", step=int(restored.trainer["step"]))
        return restored

    def init(*args: Any, **kwargs: Any) -> Any:
        world = _init(*args, **kwargs)
        light.journal("joined")
        return world

    distributed.init = init  # training.trainer calls it through the module
    ckpt_module.Checkpointer.find_latest = find_latest  # type: ignore[method-assign]
    ckpt_module.Checkpointer.restore = restore  # type: ignore[method-assign]

    if __name__ == "__main__":
        runtime_worker.main()
