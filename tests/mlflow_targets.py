"""MLflow's process-wide targets, put back: the module globals `mlflow.set_tracking_uri` and
`set_registry_uri` keep, and the variable each exports for subprocesses. MLflow has no public reset:
`set_tracking_uri(get_tracking_uri())` would export its default (`sqlite:///mlflow.db`, a file in
whatever directory a later test runs from)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

TARGETS = (
    ("mlflow.tracking._tracking_service.utils", "_tracking_uri", "MLFLOW_TRACKING_URI"),
    ("mlflow.tracking._model_registry.utils", "_registry_uri", "MLFLOW_REGISTRY_URI"),
)


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """MLflow's targets as they were on entry, again on exit."""
    before = [
        (getattr(sys.modules.get(module), name, None), os.environ.get(variable))
        for module, name, variable in TARGETS
    ]
    try:
        yield
    finally:
        for (module, name, variable), (value, exported) in zip(TARGETS, before, strict=True):
            if module in sys.modules:
                setattr(sys.modules[module], name, value)
            if exported is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = exported
