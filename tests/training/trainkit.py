"""Helpers for the training runtime tests: configs, real worker processes and their event logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from servers import free_port

REPO = Path(__file__).resolve().parents[2]


def write_flights(path: Path) -> Path:
    """The training tests' data set: the same rows wherever it is written (seeded)."""
    from training.data import write_synthetic

    write_synthetic(str(path), rows=600, features=6, seed=3)
    return path


def write_config(
    root: Path, data: Path, name: str = "work", **sections: Mapping[str, Any]
) -> tuple[Path, Path]:
    """A small config, `root/<name>.yaml`, for a run in the workdir `root/<name>`: tiny MLP, MLflow off
    unless a section turns it on. Returns (config, workdir)."""
    workdir = root / name
    raw: dict[str, Any] = {
        "seed": 7,
        "workdir": str(workdir),
        "data": {"path": str(data), "label_column": "is_delayed"},
        "model": {"hidden": [16, 16], "dropout": 0.1},
        "train": {"max_steps": 10, "global_batch_size": 32, "lr": 0.01, "warmup_steps": 2},
        "parallel": {"strategy": "ddp"},
        "checkpoint": {"interval_steps": 4, "keep_last": 3},
        "mlflow": {"enabled": False},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, workdir


@dataclass
class Workers:
    """Worker processes started the way torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""

    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    workdir: Path
    codes: list[int | None] = field(default_factory=list)

    def wait(self, timeout: float = 120.0) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"workers did not finish in {timeout}s\n{self.output()}") from None
        self.codes = codes
        return codes

    def signal(self, sig: int = signal.SIGTERM) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in self.logs if log.exists())

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(read_events(self.workdir)):
                return
            if any(p.poll() is not None for p in self.procs):
                codes = [p.poll() for p in self.procs]
                raise AssertionError(f"a worker exited early: {codes}\n{self.output()}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"condition not reached in {timeout}s\n{self.output()}")


def launch(
    config: Path,
    nproc: int,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> Workers:
    args = [sys.executable, "-m", "training.run", "--config", str(config)]
    for o in overrides:
        args += ["--set", o]
    return start_gang(args, nproc, workdir, env)


def start_gang(
    args: Sequence[str], nproc: int, workdir: Path, env: Mapping[str, str] | None = None
) -> Workers:
    """`nproc` processes of `args`, each a rank as torchrun starts it; their logs under `workdir/logs`."""
    port = free_port()
    procs, logs = [], []
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # mlflow.set_tracking_uri() in a test exports MLFLOW_TRACKING_URI; workers take theirs from the config.
    ambient = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    for rank in range(nproc):
        worker_env = {
            **ambient,
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore",
            **(env or {}),
        }
        log = log_dir / f"{time.monotonic_ns()}-rank{rank}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(args, env=worker_env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
        procs.append(proc)
        logs.append(log)
    return Workers(procs, logs, workdir)


def run_workers(
    config: Path,
    nproc: int,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
    timeout: float = 120.0,
) -> list[int]:
    workers = launch(config, nproc, workdir, env, overrides)
    codes = workers.wait(timeout)
    if any(codes):
        print(workers.output())
    return codes


def read_events(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "events.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return out


def losses(events: list[dict[str, Any]]) -> dict[int, float]:
    """Step -> loss, the last value written for each step."""
    return {e["step"]: e["loss"] for e in events if e["event"] == "step"}
