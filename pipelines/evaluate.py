"""Evaluation: the candidate model against the current champion on the run's held-out days.

Both models are loaded from the MLflow registry as they are served (raw features in, a probability
or a value out) and scored on the held-out set the training-set step built for the same run (the
same features, point in time, never seen in training) by the definition's metric (pipelines/metrics.py).
`decide` is the promotion rule, a pure function: the candidate takes the alias when it reaches the
definition's `threshold` (if it names one) and there is no champion, or it beats the champion's
metric by more than the definition's `min_improvement`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from pipelines import metrics, storage
from pipelines.definition import PipelineDefinition


@dataclass(frozen=True)
class Scored:
    version: str
    run_id: str | None
    value: float


@dataclass(frozen=True)
class Verdict:
    metric: str
    candidate: Scored
    champion: Scored | None
    promote: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary()}

    def summary(self) -> str:
        """The comparison as the approver sees it (Markdown)."""
        champion = (
            f"version {self.champion.version}: **{self.champion.value:.4f}**" if self.champion else "none yet"
        )
        return (
            f"| {self.metric} on the held-out days | |\n|---|---|\n"
            f"| candidate (version {self.candidate.version}) | **{self.candidate.value:.4f}** |\n"
            f"| champion | {champion} |\n\n"
            f"Rule: {self.reason}"
        )


def decide(
    metric: str,
    mode: str,
    candidate: Scored,
    champion: Scored | None,
    min_improvement: float,
    threshold: float | None = None,
) -> tuple[bool, str]:
    """The promotion rule: (promote, why)."""
    if not math.isfinite(candidate.value):
        return False, f"the candidate's {metric} is {candidate.value}: nothing to compare"
    if threshold is not None and (
        candidate.value < threshold if mode == "max" else candidate.value > threshold
    ):
        bound = "at least" if mode == "max" else "at most"
        return (
            False,
            f"the candidate's {metric} {candidate.value:.4f} misses the threshold: {bound} {threshold}",
        )
    if champion is None:
        return True, f"no champion yet; the candidate's {metric} is {candidate.value:.4f}"
    gain = candidate.value - champion.value if mode == "max" else champion.value - candidate.value
    verb = "beats" if gain > min_improvement else "does not beat"
    return gain > min_improvement, (
        f"the candidate's {metric} {candidate.value:.4f} {verb} the champion's {champion.value:.4f} "
        f"(version {champion.version}) by more than {min_improvement} ({'+' if gain >= 0 else ''}{gain:.4f})"
    )


def holdout(manifest_url: str) -> tuple[np.ndarray, np.ndarray]:
    """Features (float32, the manifest's column order) and labels (float64) of a held-out set."""
    import json

    fs, path = storage.filesystem(manifest_url)
    with fs.open(path) as handle:
        manifest = json.load(handle)
    data_url = storage.join(manifest_url.rsplit("/", 1)[0], manifest["data_file"])
    fs, data_path = storage.filesystem(data_url)
    with fs.open(data_path, "rb") as handle:
        frame = pd.read_parquet(handle)
    return (
        frame[manifest["feature_columns"]].to_numpy(dtype="float32"),
        frame[manifest["label_column"]].to_numpy(dtype="float64"),
    )


def score(model_uri: str, features: np.ndarray, labels: np.ndarray, tracking_uri: str, metric: str) -> float:
    """`metric` of the model's predictions (as served: raw features in) on the labels."""
    import mlflow.pyfunc

    mlflow.set_tracking_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    predicted = np.asarray(model.predict(features)).reshape(-1)
    return metrics.get(metric).compute(labels, predicted)


def evaluate(definition: PipelineDefinition, candidate: Mapping[str, Any], holdout_manifest: str) -> Verdict:
    """Score the candidate (`model_uri` models:/<name>/<version>) and the champion on the holdout."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    features, labels = holdout(holdout_manifest)
    name, metric = definition.promotion.model, definition.evaluation.metric
    uri = definition.tracking_uri
    version = str(candidate["model_uri"]).rsplit("/", 1)[-1]
    scored = Scored(
        version, candidate.get("mlflow_run_id"), score(candidate["model_uri"], features, labels, uri, metric)
    )
    try:
        current = MlflowClient(uri).get_model_version_by_alias(name, definition.promotion.alias)
    except MlflowException:
        current = None
    champion = None
    if current is not None:
        value = score(f"models:/{name}/{current.version}", features, labels, uri, metric)
        champion = Scored(str(current.version), current.run_id, value)
    rule = definition.promotion
    promote, reason = decide(
        metric, definition.evaluation.mode, scored, champion, rule.min_improvement, rule.threshold
    )
    return Verdict(metric, scored, champion, promote, reason)
