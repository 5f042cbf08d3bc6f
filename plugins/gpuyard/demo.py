"""`make demo`: the main job end to end on the embedded defaults, driven as a user would drive it.

1. the data steps on three weeks of real 2013 New York flights (ingest, validation, Spark features,
   Feast apply and materialization, point-in-time training set);
2. `gpuyard up`: API, outbox relay, scheduler and local launcher in one process, on CPU slots;
3. `gpuyard submit` of the flights-delay training job (2 workers, DDP on gloo), its logs followed;
4. the outcome: the job and its attempt, the platform metrics, and the MLflow run and model.

Everything lands in `.gpuyard/demo/` of the working directory (replaced on each run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console

from gpuyard.client import SERVER_FILE, GpuyardClient, resolve_endpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flights-delay.yaml"
WINDOW = {"start": "2013-01-01", "end": "2013-01-21", "train_start": "2013-01-08", "train_end": "2013-01-21"}
console = Console()


def _run(*command: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(
            f"{' '.join(command[:4])} ... failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


def main() -> int:
    demo = ROOT / ".gpuyard" / "demo"
    shutil.rmtree(demo, ignore_errors=True)
    home, data = demo / "home", demo / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "MLFLOW_"))}
    env |= {"GPUYARD_HOME": str(home), "GPUYARD_WORKER_DIR": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}

    console.rule(
        f"1. data steps, {WINDOW['start']}..{WINDOW['end']} (Spark local, Great Expectations, Feast)"
    )
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.run",
            "--config",
            "pipelines/flights.yaml",
            "--data-root",
            str(data),
            "--start-date",
            WINDOW["start"],
            "--end-date",
            WINDOW["end"],
            "--training-start-date",
            WINDOW["train_start"],
            "--training-end-date",
            WINDOW["train_end"],
        ],
        cwd=ROOT,
        env=env,
        check=True,
    )
    training_set = data / "training" / "flight_delay_v1" / f"{WINDOW['train_start']}_{WINDOW['train_end']}"
    manifest = json.loads((training_set / "manifest.json").read_text())
    console.print(
        f"training set: {manifest['row_count']} flights, {len(manifest['feature_columns'])} features, "
        f"{manifest['positive_rate']:.1%} late ({time.monotonic() - started:.0f}s)"
    )

    console.rule("2. gpuyard up (SQLite store, in-process bus, scheduler, local launcher on CPU slots)")
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "up", "--port", "0"], cwd=ROOT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while not (home / SERVER_FILE).exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("gpuyard up did not start; see its output above")
            time.sleep(0.2)
        token = _run(sys.executable, "-m", "gpuyard.cli", "token", "create", "--team", "a", env=env).strip()

        console.rule("3. gpuyard submit: the flights-delay training job, 2 workers")
        spec = yaml.safe_load(EXAMPLE.read_text())
        spec["resources"]["gpus"] = 2
        spec["checkpoint"]["url"] = (demo / "checkpoints").as_uri()
        spec["command"] += [
            "--set",
            f"data.path={training_set / 'data.parquet'}",
            "--set",
            "train.max_steps=200",
            "--set",
            f"workdir={demo / 'train'}",
        ]
        job_file = demo / "flights-delay.yaml"
        job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
        console.print(
            _run(sys.executable, "-m", "gpuyard.cli", "submit", str(job_file), "--token", token, env=env)
        )
        client = GpuyardClient(resolve_endpoint(token=token, home=home))
        job_id = next(client.jobs(limit=1))["id"]
        while not client.job(job_id)["attempts"]:
            time.sleep(0.5)
        console.print(f"[dim]gpuyard logs {job_id} --follow[/dim]")
        for line in client.logs(job_id, follow=True):
            if " step " in line or "checkpoint" in line or "mlflow" in line.lower() or "resum" in line:
                console.print(f"  {line}", highlight=False, markup=False)
        job = client.wait(job_id, timeout_s=600, poll_s=0.5)

        console.rule(f"4. the outcome: {job['state']}")
        console.print(_run(sys.executable, "-m", "gpuyard.cli", "show", job_id, env=env))
        summary = client._call("GET", "/v1/metrics/summary")
        console.print(
            f"platform: goodput {summary['goodput']:.2f}, queue wait p50 {summary['queue_wait_p50_s']:.1f}s, "
            f"{summary['leased_gpu_hours']:.3f} slot-hours leased (CPU slots, no GPUs)"
        )
        _show_mlflow(demo / "train")
        client.close()
        return 0 if job["state"] == "SUCCEEDED" else 1
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        console.print(f"state of this demo: {demo}")


def _show_mlflow(workdir: Path) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=5):
            metrics = {
                k: round(v, 4)
                for k, v in run.data.metrics.items()
                if k in ("val_loss", "val_accuracy", "loss")
            }
            console.print(
                f"MLflow run {run.info.run_id} ({experiment.name}): {run.info.status}, {metrics}, "
                f"attempts={run.data.tags.get('gpuyard.attempts', '?')}"
            )
    for model in client.search_registered_models():
        versions = [v.version for v in model.latest_versions or []]
        console.print(f"registered model {model.name}: versions {versions}")


if __name__ == "__main__":
    raise SystemExit(main())
