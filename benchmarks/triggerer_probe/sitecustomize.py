"""Where Airflow's triggerer supervisor spends its CPU (benchmarks/trigger_followers.py --attribute).

Measurement only, never shipped: with this folder on PYTHONPATH and GPUYARD_TRIGGERER_PROBE naming a
file, the `airflow triggerer` process wraps the steps of its supervisor loop
(`TriggerRunnerSupervisor.run_once`, Airflow 3.3.2) in CPU timers and writes their running totals to
that file every second: passes of the loop, and the CPU seconds of each step. The benchmark reads
the file at the start and the end of its measurement.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time
from typing import Any

TARGET = "airflow.jobs.triggerer_job_runner"
# the loop's steps: the metadata queries (load_triggers, clean_unused), resuming the tasks whose
# triggers fired (handle_events: Trigger.submit_event), and reading the runner's sockets
STEPS = ("load_triggers", "handle_events", "clean_unused", "heartbeat", "_service_subprocess")


def _instrument(module: Any, path: str) -> None:
    supervisor = module.TriggerRunnerSupervisor
    totals: dict[str, float] = {"passes": 0, "pass_cpu_s": 0.0, **{f"{s}_cpu_s": 0.0 for s in STEPS}}

    def timed(method: Any, key: str, count: bool = False) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return method(self, *args, **kwargs)
            finally:
                totals[key] += time.process_time() - started
                if count:
                    totals["passes"] += 1

        return wrapper

    for step in STEPS:
        setattr(supervisor, step, timed(getattr(supervisor, step), f"{step}_cpu_s"))
    supervisor.run_once = timed(supervisor.run_once, "pass_cpu_s", count=True)

    # the supervisor's thread only: the trigger runner it forks inherits no threads
    def write() -> None:
        while True:
            with open(f"{path}.tmp", "w") as sink:
                json.dump(totals | {"cpu_s": time.process_time()}, sink)
            os.replace(f"{path}.tmp", path)
            time.sleep(1)

    threading.Thread(target=write, name="triggerer-probe", daemon=True).start()


class _Finder(importlib.abc.MetaPathFinder):
    """Instruments the triggerer's module right after it is first executed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            _instrument(module, self.path)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if probe := os.environ.get("GPUYARD_TRIGGERER_PROBE"):
    sys.meta_path.insert(0, _Finder(probe))
