"""time_to_resume.py's training worker: the fault suite's real-runtime worker
(tests/faults/runtime_worker.py: `python -m training.run` on the suite's tiny model, journaling its
start, resume, saves, beats, steps and exit) plus the moments of a start the benchmark splits it by:

- `imported`: torch and the runtime are imported (`start` is journaled before);
- `joined`: the process group is up (`distributed.init`: the rendezvous of the ranks);
- `restore_began`, `restored`: the worker's restore, `Checkpointer.find_latest` (the checkpoint
  chosen and its checksums verified) then `Checkpointer.restore` (model, optimizer, RNG and trainer
  state loaded); no `restored` when there was nothing to restore.

    resume_worker.py --config RUNTIME.yaml [--set key=value ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "faults"))
import runtime_worker  # journals `start`, then imports torch and the runtime and wraps its calls

ckpt_module, light = runtime_worker.ckpt_module, runtime_worker.light
light.journal("imported")
distributed = runtime_worker.run_module.distributed
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


distributed.init = init  # training.run calls it through the module
ckpt_module.Checkpointer.find_latest = find_latest  # type: ignore[method-assign]
ckpt_module.Checkpointer.restore = restore  # type: ignore[method-assign]

if __name__ == "__main__":
    runtime_worker.main()
