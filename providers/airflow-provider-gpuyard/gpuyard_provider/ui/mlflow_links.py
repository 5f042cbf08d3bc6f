"""A job's MLflow run, for the link on its page: the run the training runtime tagged `gpuyard.job_id`,
looked up in the tracking store the job's environment names.

The page never waits long for MLflow: a lookup runs in a thread of its own and is awaited at most
WAIT_S (an MLflow that is away retries for minutes); its answer, found or not, is kept TTL_S, so a
page refreshing every few seconds asks MLflow about a job once a minute at most, and a lookup still
running is joined rather than repeated.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import NamedTuple

from cachetools import TTLCache

WAIT_S = 3.0
TTL_S = 60.0


class Run(NamedTuple):
    experiment_id: str
    run_id: str


_answers: TTLCache[tuple[str, str], Run | None] = TTLCache(maxsize=4096, ttl=TTL_S)
_asking: dict[tuple[str, str], Future[Run | None]] = {}
_lock = threading.Lock()


def find_run(tracking_uri: str, job_id: str) -> Run | None:
    """The tagged run, or None: none yet, or MLflow did not answer (an error costs the link only, as does
    a deployment without mlflow: the provider's `mlflow` extra)."""
    try:
        from mlflow.tracking import MlflowClient

        mlflow = MlflowClient(tracking_uri=tracking_uri)
        experiments = [x.experiment_id for x in mlflow.search_experiments()]
        runs = mlflow.search_runs(
            experiments, filter_string=f"tags.`gpuyard.job_id` = '{job_id}'", max_results=1
        )
    except Exception:
        return None
    return Run(runs[0].info.experiment_id, runs[0].info.run_id) if runs else None


def run_link(tracking_uri: str, ui_url: str, job_id: str, wait_s: float = WAIT_S) -> str | None:
    """The MLflow UI's page of the job's run, when MLflow says within `wait_s` (or said lately)."""
    key = (tracking_uri, job_id)
    with _lock:
        if key in _answers:
            run = _answers[key]
            return _url(ui_url, run)
        future = _asking.get(key)
        if future is None:
            future = _asking[key] = Future()
            threading.Thread(target=_ask, args=(key, future), daemon=True, name="mlflow-link").start()
    try:
        return _url(ui_url, future.result(timeout=wait_s))
    except TimeoutError:
        return None


def _ask(key: tuple[str, str], future: Future[Run | None]) -> None:
    run = find_run(*key)
    with _lock:
        _answers[key] = run
        _asking.pop(key, None)
    future.set_result(run)


def _url(ui_url: str, run: Run | None) -> str | None:
    return (
        None if run is None else f"{ui_url.rstrip('/')}/#/experiments/{run.experiment_id}/runs/{run.run_id}"
    )
