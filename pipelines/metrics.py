"""The evaluation metrics a definition may name (`evaluation.metric`): a registry, each a pure function
of the held-out labels and the model's predictions, with the direction that is better.

Classifiers predict a probability of the positive class (roc_auc, accuracy at 0.5, log_loss);
regressors predict the value itself (mae, rmse, in the label's units). A new metric is an entry here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipelines.errors import ConfigError


@dataclass(frozen=True)
class Metric:
    name: str
    mode: str  # "max" or "min": which is better
    compute: Callable[[np.ndarray, np.ndarray], float]  # (labels, predictions) -> value


def _probabilities(predicted: np.ndarray) -> np.ndarray:
    return np.clip(predicted.astype("float64"), 1e-7, 1 - 1e-7)


def roc_auc(labels: np.ndarray, predicted: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    both = len(set(labels.tolist())) == 2  # one class alone has no ranking to score
    return float(roc_auc_score(labels, _probabilities(predicted))) if both else math.nan


def accuracy(labels: np.ndarray, predicted: np.ndarray) -> float:
    return float(((_probabilities(predicted) >= 0.5).astype(int) == labels).mean())


def log_loss(labels: np.ndarray, predicted: np.ndarray) -> float:
    from sklearn.metrics import log_loss as sklearn_log_loss

    return float(sklearn_log_loss(labels, _probabilities(predicted), labels=[0, 1]))


def mae(labels: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted.astype("float64") - labels)))


def rmse(labels: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predicted.astype("float64") - labels) ** 2)))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("roc_auc", "max", roc_auc),
        Metric("accuracy", "max", accuracy),
        Metric("log_loss", "min", log_loss),
        Metric("mae", "min", mae),
        Metric("rmse", "min", rmse),
    )
}


def get(name: str) -> Metric:
    if name not in METRICS:
        raise ConfigError(f"evaluation.metric: expected one of {sorted(METRICS)}, got {name!r}")
    return METRICS[name]
